package pool_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
)

// beyondN is how many slots each round of BenchmarkBeyondPool makes.
const beyondN = 200

// BenchmarkBeyondPool measures slot creation beyond a warm pool of one:
// Gets on an empty pool from 1 and 16 callers, beside the manager making
// the same number of slots alone, one after the other. Each round starts
// from a surveyed host, as the daemon does. It is the in-process view of
// the `slotrate` part of test/bench, for profiles (-cpuprofile,
// -blockprofile, and perf for the kernel's side):
//
//	go test -run XXX -bench BeyondPool -benchtime 3x ./network/pool
func BenchmarkBeyondPool(b *testing.B) {
	b.Run("alone", func(b *testing.B) {
		for b.Loop() {
			b.StopTimer()
			m := surveyed(b, beyondN)
			b.StartTimer()
			for i := 1; i <= beyondN; i++ {
				if _, err := m.Create(context.Background(), i); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			teardownAll(b, m, beyondN)
			b.StartTimer()
		}
		b.ReportMetric(float64(beyondN*b.N)/b.Elapsed().Seconds(), "slots/s")
	})
	for _, callers := range []int{1, 16} {
		b.Run(fmt.Sprintf("get/callers=%d", callers), func(b *testing.B) {
			for b.Loop() {
				b.StopTimer()
				n := beyondN + 1
				m := surveyed(b, n)
				st, err := index.New(n, nil)
				if err != nil {
					b.Fatal(err)
				}
				p, err := pool.New(m, st, pool.Options{Target: 1})
				if err != nil {
					b.Fatal(err)
				}
				if err := p.WaitReady(context.Background(), 1); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				getAll(b, p, beyondN, callers)
				b.StopTimer()
				if err := p.Close(context.Background()); err != nil {
					b.Fatal(err)
				}
				teardownAll(b, m, n)
				b.StartTimer()
			}
			b.ReportMetric(float64(beyondN*b.N)/b.Elapsed().Seconds(), "slots/s")
		})
	}
}

// surveyed returns a manager of a new playground of n slots, surveyed.
func surveyed(b *testing.B, n int) *slot.Manager {
	m := nettest.New(b, n).Manager(b)
	if _, err := m.Survey(context.Background()); err != nil {
		b.Fatal(err)
	}
	return m
}

// getAll makes n Gets from callers goroutines.
func getAll(b *testing.B, p *pool.Pool, n, callers int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := p.Get(context.Background()); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// teardownAll removes the slots 1..n (the playground's sweep would too,
// one by one).
func teardownAll(b *testing.B, m *slot.Manager, n int) {
	all := make([]int, n)
	for i := range all {
		all[i] = i + 1
	}
	if err := m.Teardown(context.Background(), slot.Assume(all...), slot.TeardownOptions{}).Err(); err != nil {
		b.Fatal(err)
	}
}
