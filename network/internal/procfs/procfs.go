// Package procfs reads files of /proc for the network packages (mountinfo in
// netns, net/dev in slot), which grow with the number of slots.
//
// Those files hold a line per mount and per link: one of each per slot.
package procfs

import (
	"io"
	"os"
)

// readChunk is the buffer's first size. Proc files report size 0, so
// os.ReadFile would start with 512 bytes and grow, copying, at every
// doubling of a file that is large on a host with many slots.
const readChunk = 256 << 10

// ReadFile reads the whole of the proc file at path. The errors are those
// of os.Open and (*os.File).Read: an *os.PathError naming the call and the
// path.
func ReadFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b := make([]byte, 0, readChunk)
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := f.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return nil, err
		}
	}
}
