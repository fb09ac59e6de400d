// Package osthread runs a function on an OS thread that no goroutine runs
// on afterwards.
//
// It is for the kernel calls that change the calling thread's state (its
// network namespace) and take no other argument to act elsewhere.
package osthread

import (
	"runtime"

	"golang.org/x/sys/unix"
)

// Throwaway runs fn, and returns once it has, on a goroutine locked to an
// OS thread that is never unlocked, so the thread, whose namespace fn may
// change, exits with the goroutine instead of being handed back to Go: no
// switch back can fail half-way and leave a thread of the runtime in the
// wrong namespace (the alternative, containerd's pkg/netns, restores its
// thread). The main thread cannot exit (the runtime parks it forever
// instead): if the goroutine lands there, it keeps the main thread busy
// and runs fn on a nested goroutine, which then cannot run on the main
// thread.
func Throwaway(fn func()) {
	done := make(chan struct{})
	go run(fn, done)
	<-done
}

func run(fn func(), done chan<- struct{}) {
	defer close(done)
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		nested := make(chan struct{})
		go run(fn, nested)
		<-nested
		runtime.UnlockOSThread() // the main thread never ran fn
		return
	}
	fn()
}
