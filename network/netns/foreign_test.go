package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// OpenForeign opens a network namespace however the runtime names it (a
// bound file, a /proc link) and refuses anything else before a caller can
// act on it.
func TestOpenForeign(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	regular := filepath.Join(t.TempDir(), "not-a-namespace")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(t.TempDir(), "fifo") // opening it to read would block
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, path string
		want       error // nil: opens
	}{
		{"this process's network namespace", "/proc/self/ns/net", nil},
		{"a link to it", fmt.Sprintf("/proc/%d/ns/net", os.Getpid()), nil},
		{"a namespace of another type", "/proc/self/ns/mnt", ErrNotNamespace},
		{"a regular file", regular, ErrNotNamespace},
		{"a FIFO", fifo, ErrNotNamespace},
		{"a device", "/dev/null", ErrNotNamespace},
		{"nothing", filepath.Join(t.TempDir(), "missing"), unix.ENOENT},
	} {
		t.Run(c.name, func(t *testing.T) {
			fd, err := OpenForeign(c.path)
			if c.want == nil {
				if err != nil {
					t.Fatalf("OpenForeign(%s): %v", c.path, err)
				}
				unix.Close(fd)
				return
			}
			if !errors.Is(err, c.want) || fd != -1 {
				t.Fatalf("OpenForeign(%s) = %d, %v; want -1 and an error wrapping %v", c.path, fd, err, c.want)
			}
		})
	}
}
