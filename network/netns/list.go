package netns

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// Kind says what a directory entry is.
type Kind uint8

// Kinds of directory entries. Only KindFile entries can be namespaces.
const (
	KindFile Kind = iota
	KindSymlink
	KindDir
	KindOther
)

// kindNames are the kinds' names, for errors and logs.
var kindNames = [...]string{KindFile: "file", KindSymlink: "symlink", KindDir: "dir", KindOther: "other"}

// String returns the kind's name.
func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return kindNames[KindOther]
}

// Entry is one name in a netns directory.
type Entry struct {
	Name string
	Kind Kind
}

// List returns the entries of dir whose names start with prefix, without
// following symlinks. A missing directory is an empty list.
func List(dir, prefix string) ([]Entry, error) {
	f, des, err := readDir(dir, "list")
	if err != nil || f == nil {
		return nil, err
	}
	defer f.Close()
	out := make([]Entry, 0, len(des))
	for _, de := range des {
		name := de.Name()
		if !strings.HasPrefix(name, prefix) {
			continue
		}
		k := KindOther
		switch t := de.Type(); {
		case t.IsRegular():
			k = KindFile
		case t&os.ModeSymlink != 0:
			k = KindSymlink
		case t.IsDir():
			k = KindDir
		}
		out = append(out, Entry{Name: name, Kind: k})
	}
	return out, nil
}

// readDir opens dir and reads its entries, for op; a missing dir is none
// (a nil file). The caller closes the file.
func readDir(dir, op string) (*os.File, []os.DirEntry, error) {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("netns: %s: %w", op, err)
	}
	des, err := f.ReadDir(-1)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("netns: %s: %w", op, err)
	}
	return f, des, nil
}
