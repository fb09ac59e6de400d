package names

import (
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

// The names built to look like another, and the ones a client writes,
// against the rule: each refused one is refused at its first offending
// code point, named in the error, which holds nothing but printable ASCII.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     string // "" for a name the rule takes; else what the error must say
	}{
		{"plain", "rt-victim", ""},
		{"a CNI owner", "cni/pgnet", ""},
		{"a CNI request id", "0123abcd/eth0", ""},
		{"punctuation", "team:ci@host+1=a_b.c~d,e#f[0]{x}|y!?$%&'()*;<>^`", ""},
		{"the longest", strings.Repeat("x", MaxLen), ""},
		{"empty", "", "owner is empty"},
		{"one byte too long", strings.Repeat("x", MaxLen+1), "257 bytes"},
		{"U+3164 HANGUL FILLER appended", "rt-victim\u3164", `"rt-victim\u3164": U+3164, outside ASCII (Lo, Hangul), at byte 9`},
		{"U+2800 BRAILLE PATTERN BLANK", "rt-victim\u2800", "U+2800, outside ASCII (So, Braille)"},
		{"a Cyrillic a", "rt-vict\u0430m", `"rt-vict\u0430m": U+0430, outside ASCII (Ll, Cyrillic), at byte 7`},
		{"40 combining marks", "rt-victim" + strings.Repeat("\u0301", 40), "U+0301, outside ASCII (Mn, Inherited), at byte 9"},
		{"U+200B ZERO WIDTH SPACE", "rt-\u200bvictim", "U+200B, outside ASCII (Cf, Common), at byte 3"},
		{"U+00AD SOFT HYPHEN", "rt\u00ad-victim", "U+00AD, outside ASCII (Cf, Common)"},
		{"fullwidth letters", "\uff52\uff54-victim", `"\uff52\uff54-victim": U+FF52, outside ASCII (Ll, Latin), at byte 0`},
		{"NFC", "caf\u00e9", "U+00E9, outside ASCII (Ll, Latin)"},
		{"NFD", "cafe\u0301", "U+0301, outside ASCII (Mn, Inherited)"},
		{"U+202E RIGHT-TO-LEFT OVERRIDE", "rt-\u202emitciv", "U+202E, outside ASCII (Cf, Common)"},
		{"U+FEFF BOM", "\ufeffrt-victim", "U+FEFF, outside ASCII (Cf, Common)"},
		{"a tag character", "rt-victim\U000e0041", `"rt-victim\U000e0041": U+E0041, outside ASCII (Cf, Common)`},
		{"unassigned", "rt-\U000effff", "U+EFFFF, outside ASCII (unassigned)"},
		{"ESC", "rt\x1b[2K", `"rt\x1b[2K": U+001B, a control character,`},
		{"NUL", "a\x00b", `"a\x00b": U+0000, a control character, at byte 1`},
		{"DEL", "a\x7f", "U+007F, a control character"},
		{"a trailing space", "rt-victim ", `"rt-victim\x20": U+0020, a space, at byte 9`},
		{"a tab", "rt\tvictim", "U+0009, a control character"},
		{"a double quote", `rt"victim`, `"rt\x22victim": U+0022 '"', which quoting uses,`},
		{"a backslash", `rt-victim\u3164`, `"rt-victim\x5cu3164": U+005C '\\', which quoting uses,`},
		{"not UTF-8", "rt-\xff", `"rt-\xff": byte 0xFF, not UTF-8, at byte 3`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Check("owner", tc.in)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Check(%q) = %v, want nil", tc.in, err)
				}
				return
			}
			var ne *Error
			if !errors.As(err, &ne) || ne.Name != tc.in {
				t.Fatalf("Check(%q) = %#v, want an *Error of the name", tc.in, err)
			}
			msg := err.Error()
			if !strings.Contains(msg, tc.want) || !strings.HasSuffix(msg, Rule) {
				t.Errorf("Check(%q) = %q, want it to say %q and end with the rule", tc.in, msg, tc.want)
			}
			if !printableASCII(msg) {
				t.Errorf("Check(%q) = %q: not printable ASCII", tc.in, msg)
			}
		})
	}
}

// A refusal of a long name stays one short line.
func TestErrorCutsALongName(t *testing.T) {
	msg := Check("request_id", strings.Repeat("\u0301", MaxLen)).Error()
	if len(msg) > 600 || !strings.Contains(msg, `..."`) && !strings.Contains(msg, `"...`) {
		t.Errorf("the refusal of %d bytes of combining marks: %d bytes: %q", MaxLen*2, len(msg), msg)
	}
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return true
}

// unshown inverts Shown, to show that it loses nothing.
func unshown(t *testing.T, s string) string {
	t.Helper()
	var b []byte
	for i := 0; i < len(s); {
		if s[i] != '\\' {
			b = append(b, s[i])
			i++
			continue
		}
		digits := map[byte]int{'x': 2, 'u': 4, 'U': 8}[s[i+1]]
		n, err := strconv.ParseUint(s[i+2:i+2+digits], 16, 32)
		if err != nil {
			t.Fatalf("escape in %q: %v", s, err)
		}
		if s[i+1] == 'x' {
			b = append(b, byte(n))
		} else {
			b = utf8.AppendRune(b, rune(n))
		}
		i += 2 + digits
	}
	return string(b)
}

// Shown is a name itself, and anything else escaped, printable ASCII
// without space, holding '\' (which no name does) and losing nothing.
func FuzzShown(f *testing.F) {
	for _, s := range []string{"rt-victim", "rt-victim\u3164", "a\x00b", `a\b`, "a b", "\xff\xfe", "\U0001d5cb", "\ufeff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sh := Shown(s)
		valid := Check("owner", s) == nil
		switch {
		case valid && sh != s:
			t.Fatalf("Shown(%q) = %q, want the name itself", s, sh)
		case !valid && s != "" && len(s) <= MaxLen && !strings.Contains(sh, `\`):
			t.Fatalf("Shown(%q) = %q: holds no escape", s, sh)
		case firstBreak(strings.ReplaceAll(sh, `\`, "x")) >= 0:
			t.Fatalf("Shown(%q) = %q: a character the rule does not allow", s, sh)
		case unshown(t, sh) != s:
			t.Fatalf("Shown(%q) = %q, which reads back as %q", s, sh, unshown(t, sh))
		}
		if err := Check("owner", s); err != nil && !printableASCII(err.Error()) {
			t.Fatalf("Check(%q) = %q: not printable ASCII", s, err)
		}
	})
}

// ASCIIJSON prints the same JSON value in ASCII alone.
func FuzzASCIIJSON(f *testing.F) {
	for _, s := range []string{"rt-victim", "rt-victim\u3164", "\U0001d5cb", "é\u0301", "<b>&"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := json.Marshal(map[string]string{"owner": s})
		if err != nil {
			t.Skip()
		}
		out := ASCIIJSON(b)
		for _, c := range out {
			if c >= utf8.RuneSelf {
				t.Fatalf("ASCIIJSON(%s) = %s: not ASCII", b, out)
			}
		}
		var back, want map[string]string
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("ASCIIJSON(%s) = %s: %v", b, out, err)
		}
		if err := json.Unmarshal(b, &want); err != nil {
			t.Fatal(err)
		}
		if back["owner"] != want["owner"] {
			t.Fatalf("ASCIIJSON(%s) = %s, reads %q, want %q", b, out, back["owner"], want["owner"])
		}
	})
}
