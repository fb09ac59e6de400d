package names

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// MaxLen bounds a name, in bytes: names are logged, listed and recorded.
const MaxLen = 256

// Rule is the rule in the words every refusal ends with.
const Rule = `names are printable ASCII but space, '"' and '\', 1 to 256 bytes`

// allowed reports whether byte b may appear in a name. Space is out
// because a trailing one is invisible; '"' and '\' because they are what
// quoting and [Shown]'s escapes are made of, so that an escaped name can
// never be a name.
func allowed(b byte) bool { return b > ' ' && b < 0x7f && b != '"' && b != '\\' }

// Error is a name the rule refuses.
type Error struct {
	// What names the field: "owner", "request_id", "owners[2]".
	What string
	// Name is the name as given. Print it with [Shown], never raw.
	Name string
	// Offset is the byte offset of the first character that breaks the
	// rule; -1 when the name is empty or too long.
	Offset int
}

// Error says which field broke the rule, how, and the rule, in one line
// of printable ASCII.
func (e *Error) Error() string {
	switch {
	case e.Name == "":
		return fmt.Sprintf("%s is empty: %s", e.What, Rule)
	case e.Offset < 0:
		return fmt.Sprintf("%s %s is %d bytes: %s", e.What, quoted(e.Name, 64), len(e.Name), Rule)
	}
	return fmt.Sprintf("%s %s: %s at byte %d: %s", e.What, quoted(e.Name, 64), describe(e.Name[e.Offset:]), e.Offset, Rule)
}

// Check returns nil if name follows the rule, and an [*Error] for field
// what if not.
func Check(what, name string) error {
	if name == "" || len(name) > MaxLen {
		return &Error{What: what, Name: name, Offset: -1}
	}
	if i := firstBreak(name); i >= 0 {
		return &Error{What: what, Name: name, Offset: i}
	}
	return nil
}

// firstBreak returns the offset of the first byte of s the rule does not
// allow, or -1.
func firstBreak(s string) int {
	for i := 0; i < len(s); i++ {
		if !allowed(s[i]) {
			return i
		}
	}
	return -1
}

// Shown returns s as people may read it: s itself when every character of
// it is one the rule allows, and otherwise s with each other character
// escaped (\x20, \x22, \x5c, \x1b, \xff for a byte that is not UTF-8,
// \u3164, \U0001d5cb). An escaped form holds '\', which no name does, so it
// never reads as a name; and distinct strings are shown distinct. The
// length is not checked: a recorded name is shown whole.
func Shown(s string) string {
	if firstBreak(s) < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		if allowed(s[i]) {
			b.WriteByte(s[i])
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1, r < utf8.RuneSelf:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r <= 0xffff:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			fmt.Fprintf(&b, `\U%08x`, r)
		}
		i += n
	}
	return b.String()
}

// quoted is s shown and in double quotes, cut after about max bytes of
// s: an error line stays one short line.
func quoted(s string, max int) string {
	if len(s) <= max {
		return `"` + Shown(s) + `"`
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return `"` + Shown(s[:cut]) + `"...`
}

// describe names the first character of s, which breaks the rule: its code
// point and why, with the general category and script of one outside
// ASCII, so that "rt-victim" + U+3164 reads as what it is.
func describe(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	switch {
	case r == utf8.RuneError && n == 1:
		return fmt.Sprintf("byte 0x%02X, not UTF-8,", s[0])
	case r == ' ':
		return "U+0020, a space,"
	case r == '"' || r == '\\':
		return fmt.Sprintf("U+%04X %q, which quoting uses,", r, r)
	case r < ' ' || r == 0x7f:
		return fmt.Sprintf("U+%04X, a control character,", r)
	}
	return fmt.Sprintf("U+%04X, outside ASCII (%s),", r, classOf(r))
}

// classOf returns r's general category and script ("Lo, Hangul"), or
// "unassigned".
func classOf(r rune) string {
	cat, script := "", ""
	for _, k := range slices.Sorted(maps.Keys(unicode.Categories)) {
		// The one-letter categories (L, M) and LC are unions of the others.
		if len(k) == 2 && k != "LC" && unicode.Is(unicode.Categories[k], r) {
			cat = k
			break
		}
	}
	for _, k := range slices.Sorted(maps.Keys(unicode.Scripts)) {
		if unicode.Is(unicode.Scripts[k], r) {
			script = k
			break
		}
	}
	switch {
	case cat == "" || cat == "Cn":
		return "unassigned"
	case script == "":
		return cat
	}
	return cat + ", " + script
}

// ASCIIJSON returns JSON text b with every character outside ASCII written
// as a \u escape (a surrogate pair above U+FFFF): the same JSON value,
// printed so that a name recorded before the rule cannot look like
// another. Outside strings JSON holds ASCII alone, so every such
// character is in a string, where the escape means the character.
func ASCIIJSON(b []byte) []byte {
	i := slices.IndexFunc(b, func(c byte) bool { return c >= utf8.RuneSelf })
	if i < 0 {
		return b
	}
	out := append(make([]byte, 0, len(b)+len(b)/4), b[:i]...)
	for i < len(b) {
		if b[i] < utf8.RuneSelf {
			out = append(out, b[i])
			i++
			continue
		}
		r, n := utf8.DecodeRune(b[i:])
		if r1, r2 := utf16.EncodeRune(r); r1 != unicode.ReplacementChar {
			out = fmt.Appendf(out, `\u%04x\u%04x`, r1, r2)
		} else {
			out = fmt.Appendf(out, `\u%04x`, r)
		}
		i += n
	}
	return out
}
