package main

import (
	"testing"

	"github.com/phasegate/phasegate/network/pool"
)

// TestBurstPool checks that the warm pool of a burst is the smallest that
// holds its reserve after it: one slot less and the pool would refill
// beside the calls.
func TestBurstPool(t *testing.T) {
	for _, n := range []int{1, 2, 3, 40, 100, 999, 1000, 5000} {
		warm := burstPool(n)
		if left := warm - n; left < pool.Reserve(warm) {
			t.Errorf("burstPool(%d) = %d: %d left after the burst, below the reserve %d", n, warm, left, pool.Reserve(warm))
		}
		if left := warm - 1 - n; left >= pool.Reserve(warm-1) {
			t.Errorf("burstPool(%d) = %d: %d would do (%d left, reserve %d)", n, warm, warm-1, left, pool.Reserve(warm-1))
		}
	}
}
