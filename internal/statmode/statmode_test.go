package statmode_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/internal/statmode"
)

// TestTypeNamesWhatStatSays makes a file of each type a test can make
// without privilege and checks the name stat's mode gives it.
func TestTypeNamesWhatStatSays(t *testing.T) {
	dir := t.TempDir()
	make := map[string]func(path string) error{
		"regular file": func(p string) error { return os.WriteFile(p, nil, 0o600) },
		"directory":    func(p string) error { return os.Mkdir(p, 0o700) },
		"symlink":      func(p string) error { return os.Symlink("elsewhere", p) },
		"FIFO":         func(p string) error { return unix.Mkfifo(p, 0o600) },
		"socket": func(p string) error {
			l, err := net.Listen("unix", p)
			if err == nil {
				t.Cleanup(func() { _ = l.Close() })
			}
			return err
		},
	}
	for want, mk := range make {
		t.Run(want, func(t *testing.T) {
			p := filepath.Join(dir, filepath.Base(t.Name()))
			if err := mk(p); err != nil {
				t.Fatal(err)
			}
			var st unix.Stat_t
			if err := unix.Lstat(p, &st); err != nil {
				t.Fatal(err)
			}
			if got := statmode.Type(st.Mode); got != want {
				t.Errorf("Type(%#o) = %q, want %q", st.Mode, got, want)
			}
		})
	}
	if got := statmode.Type(0o110000); got != "file of type 0110000" {
		t.Errorf("an unknown type: %q", got)
	}
}
