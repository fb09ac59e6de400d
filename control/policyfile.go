package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/rootdir"
	"github.com/phasegate/phasegate/internal/statmode"
)

// MaxPolicySize bounds a policy file, in bytes: a policy of thousands of
// rules fits many times over, and a file that is not a policy is refused
// before it is read whole.
const MaxPolicySize = 1 << 20

// LoadPolicy reads a policy file, resolves its user and group names and
// checks it. The file must be a regular file owned by root (or by the user
// the daemon runs as, root in every deployment) and writable by nobody
// else, in a directory only root controls (internal/rootdir's rule), named
// without a symlink as its last component: whoever may write it may grant
// themselves every owner. It is read strictly, where
// encoding/json is lenient: a key given twice in one object, a key that
// matches a field only when case is ignored, an unknown key, data after the
// value, bytes that are not UTF-8 and a file over [MaxPolicySize] are
// refused, naming the key and its line. A file without "rate" gets
// [DefaultRate].
func LoadPolicy(path string) (*AccessPolicy, error) {
	b, err := ReadPolicyFile(path)
	if err != nil {
		return nil, err
	}
	return ParsePolicyFile(path, b)
}

// ParsePolicyFile parses b, the content of the policy file at path that
// [ReadPolicyFile] returned, as [LoadPolicy] does: errors name path.
func ParsePolicyFile(path string, b []byte) (*AccessPolicy, error) {
	p, err := parsePolicy(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// ParsePolicy parses a policy in its JSON form, as strictly as
// [LoadPolicy].
func ParsePolicy(r io.Reader) (*AccessPolicy, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxPolicySize+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if len(b) > MaxPolicySize {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrPolicy, MaxPolicySize)
	}
	return parsePolicy(b)
}

func parsePolicy(b []byte) (*AccessPolicy, error) {
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("%w: not UTF-8 (at line %d)", ErrPolicy, lineOf(b, invalidUTF8(b)))
	}
	if err := checkKeys(b, reflect.TypeFor[AccessPolicy]()); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	p := AccessPolicy{Rate: DefaultRate}
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, err)
	}
	if err := p.Resolve(); err != nil {
		return nil, err
	}
	return &p, nil
}

// ReadPolicyFile reads the policy file at path with every check of
// [LoadPolicy] but the parsing: it opens path without following a symlink
// at its last component, checks the directories above it and the
// descriptor it opened (not the path, which could be swapped meanwhile),
// and reads it. A daemon's in-place upgrade reads the file with it again
// at SIGHUP (app.ConfigFiles).
func ReadPolicyFile(path string) ([]byte, error) {
	// Whoever may write the directory may replace the file between two
	// starts: it must be root's too, and every directory above it.
	if err := rootdir.Check(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("%w %s: %w", ErrPolicy, path, err)
	}
	// O_NONBLOCK: a FIFO put at the path must not hang the start; it is
	// refused below as not a regular file.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		var st unix.Stat_t
		if unix.Lstat(path, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
			return nil, fmt.Errorf("%w %s: a symlink (owner uid %d, mode %04o): give the path of the file itself", ErrPolicy, path, st.Uid, st.Mode&0o7777)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrPolicy, &fs.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("%w: fstat %s: %w", ErrPolicy, path, err)
	}
	if err := checkPolicyFile(path, &st); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxPolicySize+1))
	if err != nil {
		return nil, fmt.Errorf("%w: read %s: %w", ErrPolicy, path, err)
	}
	if len(b) > MaxPolicySize {
		return nil, fmt.Errorf("%w %s: larger than %d bytes", ErrPolicy, path, MaxPolicySize)
	}
	return b, nil
}

// checkPolicyFile refuses a policy file someone other than root could
// have written, or that is not a regular file of a policy's size.
func checkPolicyFile(path string, st *unix.Stat_t) error {
	perm := st.Mode & 0o7777
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		return fmt.Errorf("%w %s: not a regular file (owner uid %d, mode %04o, type %s)", ErrPolicy, path, st.Uid, perm, statmode.Type(st.Mode))
	case st.Uid != 0 && st.Uid != uint32(os.Geteuid()):
		return fmt.Errorf("%w %s: owner uid %d, mode %04o: must be owned by root (chown root %s)", ErrPolicy, path, st.Uid, perm, path)
	case perm&0o022 != 0:
		return fmt.Errorf("%w %s: owner uid %d, mode %04o: must not be writable by group or others (chmod go-w %s)", ErrPolicy, path, st.Uid, perm, path)
	case st.Size > MaxPolicySize:
		return fmt.Errorf("%w %s: %d bytes, larger than %d", ErrPolicy, path, st.Size, MaxPolicySize)
	}
	return nil
}

// checkKeys walks the JSON value in b once, token by token, beside the Go
// type it decodes into, and refuses what encoding/json would take in
// silence: a key given twice in one object (the last would win), a key
// that names a field only when case is ignored ("READ_ONLY"), an unknown
// key, and anything after the value. Types are left to the decoder; a
// container where the type has none is refused here, so the walk is never
// deeper than the type.
func checkKeys(b []byte, t reflect.Type) error {
	w := keyWalker{b: b, dec: json.NewDecoder(bytes.NewReader(b))}
	w.dec.UseNumber()
	if err := w.value(t, ""); err != nil {
		return err
	}
	off := w.dec.InputOffset()
	if rest := bytes.TrimLeft(b[off:], " \t\r\n"); len(rest) > 0 {
		return fmt.Errorf("%w: data after the policy's JSON value, at line %d", ErrPolicy, lineOf(b, len(b)-len(rest)))
	}
	return nil
}

// keyWalker reads the tokens of one JSON value.
type keyWalker struct {
	b   []byte
	dec *json.Decoder
}

// fail reports a problem with the key or value at path, where the decoder
// is now.
func (w keyWalker) fail(path, format string, a ...any) error {
	if path == "" {
		path = "the policy"
	}
	return fmt.Errorf("%w: %s at line %d: %s", ErrPolicy, path, lineOf(w.b, int(w.dec.InputOffset())), fmt.Sprintf(format, a...))
}

func (w keyWalker) token() (json.Token, error) {
	tok, err := w.dec.Token()
	switch {
	case (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)) && len(bytes.TrimSpace(w.b)) == 0:
		return nil, fmt.Errorf("%w: empty: no JSON value", ErrPolicy)
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		return nil, w.truncated()
	}
	if err != nil {
		return nil, fmt.Errorf("%w: at line %d: %w", ErrPolicy, lineOf(w.b, int(w.dec.InputOffset())), err)
	}
	return tok, nil
}

// truncated is the error of a policy whose JSON ends before its value
// does (a write cut short), at the offset and line where it ends.
func (w keyWalker) truncated() error {
	return fmt.Errorf("%w: truncated: not valid JSON at offset %d (line %d): the file ends before its value does", ErrPolicy, len(w.b), lineOf(w.b, len(w.b)))
}

// value walks one value that decodes into t.
func (w keyWalker) value(t reflect.Type, path string) error {
	tok, err := w.token()
	if err != nil {
		return err
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n, ok := tok.(json.Number); ok {
		return w.number(n, path)
	}
	switch tok {
	case json.Delim('{'):
		if t.Kind() != reflect.Struct {
			return w.fail(path, "an object, where %s belongs", jsonKind(t))
		}
		return w.object(t, path)
	case json.Delim('['):
		if t.Kind() != reflect.Slice {
			return w.fail(path, "a list, where %s belongs", jsonKind(t))
		}
		for i := 0; w.dec.More(); i++ {
			if err := w.value(t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err := w.token() // ]
		return err
	}
	return nil
}

// number refuses a number written as a negative zero ("-0", "-0.0",
// "-1e-400"): encoding/json takes it as 0 (or -0, which compares equal),
// and a sign that means nothing is a mistake to show, not a value to
// guess at.
func (w keyWalker) number(n json.Number, path string) error {
	if f, err := strconv.ParseFloat(string(n), 64); err == nil && f == 0 && strings.HasPrefix(string(n), "-") {
		return w.fail(path, "%s is a negative zero: write 0, or the negative number meant", n)
	}
	return nil
}

// object walks the keys and values of an object that decodes into struct
// type t, the opening brace read.
func (w keyWalker) object(t reflect.Type, path string) error {
	seen := map[string]bool{}
	for w.dec.More() {
		tok, err := w.token()
		if err != nil {
			return err
		}
		key := tok.(string) // the decoder allows nothing else here
		at := key
		if path != "" {
			at = path + "." + key
		}
		if seen[key] {
			return w.fail(at, "given twice in one object (a JSON decoder keeps the last without a word)")
		}
		seen[key] = true
		ft, name := jsonField(t, key)
		switch {
		case ft == nil && name != "":
			return w.fail(at, "differs only in case from %q: write %q", name, name)
		case ft == nil:
			return w.fail(at, "unknown field %q", key)
		}
		if err := w.value(ft, at); err != nil {
			return err
		}
	}
	_, err := w.token() // }
	return err
}

// jsonField returns the type of the field of struct t that JSON key key
// names exactly; or, when none does, the name of a field key matches only
// when case is ignored, as encoding/json would match it.
func jsonField(t reflect.Type, key string) (reflect.Type, string) {
	var folded string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if !f.IsExported() || name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if name == key {
			return f.Type, name
		}
		if strings.EqualFold(name, key) {
			folded = name
		}
	}
	return nil, folded
}

// jsonKind names the JSON value Go type t decodes from.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Struct:
		return "an object"
	case reflect.Slice:
		return "a list"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	}
	return "a number"
}

// lineOf returns the line of byte offset off in b, counting from 1.
func lineOf(b []byte, off int) int {
	return bytes.Count(b[:min(max(off, 0), len(b))], []byte("\n")) + 1
}

// invalidUTF8 returns the offset of the first byte of b that is not UTF-8.
func invalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return len(b)
}
