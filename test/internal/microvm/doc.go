// Package microvm boots the end-to-end tests' microVM guest under QEMU
// inside a network namespace, on a tap there, and stops it.
//
// The guest (a Debian cloud kernel and a busybox initramfs) is built and
// cached by tools/guest/build.sh; Locate finds it through PHASEGATE_GUEST
// or runs that script. QEMU uses its software accelerator (nested KVM hangs
// at boot on the machines the tests run on) and runs under nsenter in the
// namespace, so that its tap device is the namespace's. Everything the guest
// is told (its address, gateway, echo port, the addresses it probes) is on
// its kernel command line; it reports on its serial console, which QEMU
// writes to a file that Console and WaitConsole read.
//
// A machine that cannot run the guest (no QEMU, no built guest) is an
// error that says why: callers fail the test on it, never skip.
package microvm
