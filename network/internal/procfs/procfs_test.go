package procfs

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// A file larger than the first buffer is read whole: the buffer grows.
func TestReadFileLargerThanChunk(t *testing.T) {
	want := bytes.Repeat([]byte("0123456789abcdef\n"), readChunk/8)
	path := filepath.Join(t.TempDir(), "big")
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("ReadFile read %d bytes, want %d", len(got), len(want))
	}
}

// A proc file, which reports size 0, is read whole.
func TestReadFileProc(t *testing.T) {
	got, err := ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 || got[len(got)-1] != '\n' {
		t.Fatalf("ReadFile(/proc/self/mountinfo) = %q, want whole lines", got)
	}
}

// The error names the call and the path.
func TestReadFileMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing")
	_, err := ReadFile(path)
	var pe *fs.PathError
	if !errors.As(err, &pe) || pe.Op != "open" || pe.Path != path || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("ReadFile(missing) error = %v, want an open *fs.PathError for %s", err, path)
	}
}
