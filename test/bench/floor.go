package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// floorResult is one kernel-floor run.
type floorResult struct {
	// Duration is detach+unlink of every netns file plus the wait until
	// every host end is gone: the floor's "time to serving".
	Duration time.Duration
	// Unlink is the detach+unlink part of Duration.
	Unlink time.Duration
	// Firewall is the one nftables transaction removing the set elements,
	// done after Duration and not part of it.
	Firewall time.Duration
}

// kernelFloor removes the leaked slots 1..n by the bare minimum: workers
// detach (MNT_DETACH) and unlink the netns files, then it waits until the
// kernel has destroyed the namespaces and with them the veth pairs (the host
// ends are gone). No process scan, no per-slot bookkeeping. The host ends'
// indices are resolved through netlink before the clock starts, and polled
// by index (SIOCGIFNAME: a lookup by name would make the kernel try to load a
// module for every vanished link). The set elements are removed afterwards
// in one transaction, timed apart.
func kernelFloor(ctx context.Context, h *host, n, workers int) (floorResult, error) {
	var r floorResult
	links := h.leaked
	if len(links) != n {
		return r, fmt.Errorf("floor: %d host ends, want %d", len(links), n)
	}
	start := time.Now()
	if err := unlinkNetns(h, workers); err != nil {
		return r, fmt.Errorf("floor: %w", err)
	}
	r.Unlink = time.Since(start)
	if err := waitLinksGone(ctx, links, 10*time.Minute); err != nil {
		return r, fmt.Errorf("floor: %w", err)
	}
	r.Duration = time.Since(start)

	t0 := time.Now()
	names := make([]string, 0, n)
	for i := 1; i <= n; i++ {
		names = append(names, h.cfg.HostIfName(i))
	}
	tbl, err := h.table()
	if err != nil {
		return r, err
	}
	if err := tbl.Remove(ctx, names...); err != nil {
		return r, fmt.Errorf("floor: set elements: %w", err)
	}
	r.Firewall = time.Since(t0)
	return r, nil
}

// unlinkNetns detaches (MNT_DETACH) and unlinks every netns file of the
// prefix, from workers goroutines.
func unlinkNetns(h *host, workers int) error {
	ents, err := os.ReadDir(h.cfg.NetnsDir)
	if err != nil {
		return err
	}
	paths := make(chan string, len(ents))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), h.cfg.Prefix) {
			paths <- filepath.Join(h.cfg.NetnsDir, e.Name())
		}
	}
	close(paths)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for p := range paths {
				_ = unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
				_ = unix.Unlink(p)
			}
		})
	}
	wg.Wait()
	return nil
}

// waitLinksGone polls (from 1 ms backing off to 20 ms) until none of the
// links exists under its name.
func waitLinksGone(ctx context.Context, links []hostLink, timeout time.Duration) error {
	left := links
	delay := time.Millisecond
	deadline := time.Now().Add(timeout)
	for {
		var err error
		if left, err = linksPresent(left); err != nil {
			return err
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d host ends still there after %v", len(left), timeout)
		}
		if err := sleep(ctx, delay); err != nil {
			return err
		}
		delay = min(2*delay, 20*time.Millisecond)
	}
}

// linksPresent returns the links that exist, by index and name
// (SIOCGIFNAME: a lookup by name would make the kernel try to load a
// module for every vanished link).
func linksPresent(links []hostLink) ([]hostLink, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	defer unix.Close(fd)
	var out []hostLink
	for _, l := range links {
		ifr, err := unix.NewIfreq("")
		if err != nil {
			return nil, err
		}
		ifr.SetUint32(uint32(l.index))
		if unix.IoctlIfreq(fd, unix.SIOCGIFNAME, ifr) == nil && ifr.Name() == l.name {
			out = append(out, l)
		}
	}
	return out, nil
}
