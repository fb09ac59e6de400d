package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"time"
)

// A run's namespaces outlive their files and links: the kernel's clean-up
// worker runs their exit handlers (and the RCU grace periods between them)
// seconds after the last reference went, ~4 s for 10,000 on two cores.
// A part that starts meanwhile shares the CPUs with it, which is what the
// -settle pause alone did not wait for after a part at 10,000.
const (
	// netnsSlop is how many namespaces beyond the count at the start
	// the wait accepts: SLUB counts the free objects of the slabs a CPU
	// holds as in use, a few slabs' worth of this cache.
	netnsSlop = 128
	// netnsStill ends the wait early once the count has not fallen for
	// that long: SLUB's count can stay above the slop with nothing left
	// to tear down (free objects in slabs a CPU keeps on its partial
	// list are counted as in use), and the kernel frees a batch's
	// namespaces every few hundred ms while it works.
	netnsStill = time.Second
	// kernelSettleMax bounds the wait: another tenant's namespaces made
	// meanwhile raise the count for good, and the wait then takes the
	// count it ended at as the new baseline.
	kernelSettleMax = time.Minute
)

// slabinfoPath is where the kernel reports its slab caches (root only).
const slabinfoPath = "/proc/slabinfo"

// kernelNetns is how many network namespaces the kernel holds now, those
// being torn down included: the net_namespace slab cache's objects in use.
func kernelNetns() (int, error) {
	b, err := os.ReadFile(slabinfoPath)
	if err != nil {
		return 0, err
	}
	return netnsInSlabinfo(b)
}

// netnsInSlabinfo reads the net_namespace cache's active objects from
// /proc/slabinfo's text ("name active_objs num_objs …").
func netnsInSlabinfo(b []byte) (int, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := bytes.Fields(sc.Bytes())
		if len(f) < 2 || string(f[0]) != "net_namespace" {
			continue
		}
		n, err := strconv.Atoi(string(f[1]))
		if err != nil {
			return 0, fmt.Errorf("%s: net_namespace: %w", slabinfoPath, err)
		}
		return n, nil
	}
	return 0, fmt.Errorf("%s: no net_namespace cache", slabinfoPath)
}

// kernelBaseline is the machine's count of network namespaces when the
// benchmark started, and what waitKernel waits to get back to.
type kernelBaseline struct {
	netns int // -1: the count cannot be read here, and nothing is waited for
}

// newKernelBaseline reads the count now.
func newKernelBaseline() *kernelBaseline {
	n, err := kernelNetns()
	if err != nil {
		return &kernelBaseline{netns: -1}
	}
	return &kernelBaseline{netns: n}
}

// wait waits until the kernel holds at most netnsSlop namespaces beyond
// the baseline, or its count has stood still for netnsStill, for up to
// kernelSettleMax. Past the bound it takes the count it ended at as the
// baseline.
func (k *kernelBaseline) wait(ctx context.Context) error {
	if k.netns < 0 {
		return nil
	}
	t0 := time.Now()
	low, fell := -1, t0 // the lowest count seen, and when it was last lowered
	for {
		n, err := kernelNetns()
		if err != nil {
			return err
		}
		if n <= k.netns+netnsSlop {
			return nil
		}
		if low < 0 || n < low {
			low, fell = n, time.Now()
		} else if time.Since(fell) >= netnsStill {
			return nil
		}
		if time.Since(t0) > kernelSettleMax {
			k.netns = n
			return nil
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
}
