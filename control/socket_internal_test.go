package control

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// longDir returns a directory whose path, joined with base, is n bytes.
func longDir(t *testing.T, base string, n int) string {
	t.Helper()
	dir := t.TempDir()
	pad := n - len(filepath.Join(dir, "x", base)) + 1
	if pad < 1 {
		t.Fatalf("the temporary directory %s is too long already", dir)
	}
	dir = filepath.Join(dir, strings.Repeat("d", pad))
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A path as long as a socket address can be is bound, though the
// temporary name it is bound at first is longer, and a client reaches it;
// one byte longer is refused before anything is made.
func TestListenAtTheLongestPath(t *testing.T) {
	path := filepath.Join(longDir(t, "control.sock", maxPathLen), "control.sock")
	if len(path) != maxPathLen {
		t.Fatalf("path of %d bytes, want %d", len(path), maxPathLen)
	}
	l, s, err := Listen(context.Background(), path, SocketOptions{GID: -1})
	if err != nil {
		t.Fatalf("Listen at a path of %d bytes: %v", len(path), err)
	}
	defer l.Close()
	c, err := net.Dial("unix", path)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	c.Close()
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 || entries[0].Name() != "control.sock" {
		t.Errorf("the directory holds %v, want the socket alone", entries)
	}
	if err := s.Remove(); err != nil {
		t.Fatal(err)
	}

	long := filepath.Join(longDir(t, "control.sock", maxPathLen+1), "control.sock")
	if _, _, err := Listen(context.Background(), long, SocketOptions{GID: -1}); !errors.Is(err, ErrSocket) || !strings.Contains(err.Error(), "longer than") {
		t.Errorf("Listen at a path of %d bytes: %v, want it refused as too long", len(long), err)
	}
	if entries, _ := os.ReadDir(filepath.Dir(long)); len(entries) != 0 {
		t.Errorf("a refused path left %v", entries)
	}
}
