package main

import (
	"os"
	"testing"
)

func TestNetnsInSlabinfo(t *testing.T) {
	const header = "slabinfo - version: 2.1\n# name            <active_objs> <num_objs> <objsize> <objperslab> <pagesperslab> : tunables <limit> <batchcount> <sharedfactor> : slabdata <active_slabs> <num_slabs> <sharedavail>\n"
	for _, tc := range []struct {
		name, text string
		want       int
		ok         bool
	}{
		{"the cache", header + "net_namespace      10213  10213   4288    7    8 : tunables    0    0    0 : slabdata   1459   1459      0\n", 10213, true},
		{"among others", header + "netns_x 5 5 64 64 1 : tunables 0 0 0 : slabdata 1 1 0\nnet_namespace 42 49 4288 7 8 : tunables 0 0 0 : slabdata 7 7 0\n", 42, true},
		{"no such cache", header + "kmalloc-64 100 128 64 64 1 : tunables 0 0 0 : slabdata 2 2 0\n", 0, false},
		{"not a number", header + "net_namespace many 49 4288 7 8\n", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := netnsInSlabinfo([]byte(tc.text))
			if (err == nil) != tc.ok || got != tc.want {
				t.Errorf("netnsInSlabinfo = %d, %v; want %d, ok %v", got, err, tc.want, tc.ok)
			}
		})
	}
}

// TestKernelNetns reads this machine's count, where it can be read.
func TestKernelNetns(t *testing.T) {
	if _, err := os.Stat(slabinfoPath); err != nil || os.Geteuid() != 0 {
		t.Skip("no /proc/slabinfo to read here")
	}
	n, err := kernelNetns()
	if err != nil {
		t.Fatal(err)
	}
	if n < 1 { // the initial namespace at least
		t.Errorf("kernelNetns = %d", n)
	}
}
