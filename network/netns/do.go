package netns

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
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
	onThrowawayThread(func() {
		if err = unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			err = fmt.Errorf("netns: setns(fd %d, CLONE_NEWNET): %w", fd, err)
			return
		}
		err = fn()
	})
	return err
}

// onThrowawayThread runs fn, and returns once it has, on a goroutine
// locked to an OS thread that is never unlocked, so the thread, whose
// network namespace fn may change, exits with the goroutine. The main
// thread cannot exit (the runtime parks it forever instead): if the
// goroutine lands there, it keeps the main thread busy and runs fn on a
// nested goroutine, which then cannot run on the main thread.
func onThrowawayThread(fn func()) {
	done := make(chan struct{})
	go runThrowaway(fn, done)
	<-done
}

func runThrowaway(fn func(), done chan<- struct{}) {
	defer close(done)
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		nested := make(chan struct{})
		go runThrowaway(fn, nested)
		<-nested
		runtime.UnlockOSThread() // the main thread never changed namespace
		return
	}
	fn()
}
