package hostwatch

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// namer names links by index: from the link notifications seen, else by
// SIOCGIFNAME on a socket of its own. Only Watch's receiving goroutine
// uses it.
type namer struct {
	fd    int
	known map[int32]string
}

func newNamer() (*namer, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("hostwatch: socket for SIOCGIFNAME: %w", err)
	}
	return &namer{fd: fd, known: map[int32]string{}}, nil
}

func (n *namer) close() { _ = unix.Close(n.fd) }

func (n *namer) remember(index int32, name string) { n.known[index] = name }

func (n *namer) forget(index int32) { delete(n.known, index) }

// ours reports whether link index is the caller's own; a link that cannot
// be named (gone) is not.
func (n *namer) ours(index int32, ours func(string) bool) bool {
	name, ok := n.known[index]
	if !ok {
		ifr, err := unix.NewIfreq("")
		if err != nil {
			return false
		}
		ifr.SetUint32(uint32(index))
		if err := unix.IoctlIfreq(n.fd, unix.SIOCGIFNAME, ifr); err != nil {
			return false
		}
		name = ifr.Name()
		n.known[index] = name
	}
	return ours(name)
}
