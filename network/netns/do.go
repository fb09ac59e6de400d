package netns

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/phasegate/phasegate/network/internal/osthread"
)

// Do runs fn on an OS thread that has entered the network namespace of the
// descriptor fd, for the few kernel calls that act in the caller's
// namespace and take no namespace argument (opening /dev/net/tun: a tap
// is made in the namespace of the thread that opens the device, whatever
// netlink handle is used afterwards).
//
// The thread is locked to a goroutine of its own and never unlocked: it
// exits with that goroutine instead of being handed back to Go in another
// namespace, so no namespace switch-back can fail half-way (the way
// containerd's pkg/netns restores its thread is the alternative; this one
// cannot leave a thread behind in the wrong namespace). The main thread,
// which cannot exit, is never the one that changes namespace.
func Do(fd int, fn func() error) error {
	var err error
	osthread.Throwaway(func() {
		if err = unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			err = fmt.Errorf("netns: setns(fd %d, CLONE_NEWNET): %w", fd, err)
			return
		}
		err = fn()
	})
	return err
}
