package slot_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/phasegate/phasegate/network/internal/nettest"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/slot"
)

// Slots of a run with a larger --slots are ours: a canonical name beyond
// Slots is listed (and in Beyond) and torn down, link and element included.
// An index whose host link name cannot fit IFNAMSIZ has only a netns file.
// Look-alikes beyond Slots stay untouched. Before, every name beyond Slots
// was taken for foreign and kept for ever.
func TestSurveyBeyondSlots(t *testing.T) {
	env := nettest.New(t, 20)
	m := env.Manager(t)
	ctx := context.Background()
	c := m.Config()
	bigCfg := c
	bigCfg.Slots = 40
	big, err := slot.NewManager(ctx, bigCfg, slot.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{3, 30, 40} {
		if _, err := big.Create(ctx, i); err != nil {
			t.Fatal(err)
		}
	}
	// Too long for a link: prefix (6) + "h" + 9 digits = 16 bytes.
	huge := 123456789
	if c.HostIfFits(huge) {
		t.Fatalf("%s fits", c.HostIfName(huge))
	}
	if _, err := netns.Create(ctx, c.NetnsDir, c.NetnsName(huge)); err != nil {
		t.Fatal(err)
	}
	// Look-alikes beyond Slots.
	lookalikes := []string{c.Prefix + "031", c.Prefix + "32", c.Prefix + "33"}
	if _, err := netns.Create(ctx, c.NetnsDir, lookalikes[0]); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(c.NetnsPath(30), c.NetnsPath(32)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(c.NetnsPath(33), []byte("not a namespace"), 0o600); err != nil {
		t.Fatal(err)
	}

	sr, err := m.Survey(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := slot.Inventory{3: slot.All, 30: slot.All, 40: slot.All, huge: slot.HasNetns}
	if !maps(sr.Inventory, want) || !slices.Equal(sr.Beyond, []int{30, 40, huge}) || len(sr.Unreadable) != 0 {
		t.Fatalf("Survey = %v beyond %v unreadable %v; want %v beyond [30 40 %d]", sr.Inventory, sr.Beyond, sr.Unreadable, want, huge)
	}
	res := m.Teardown(ctx, sr.Inventory, slot.TeardownOptions{})
	if !slices.Equal(res.Reclaimed, []int{3, 30, 40, huge}) || len(res.Failed) != 0 {
		t.Fatalf("Teardown: %v (%v)", res, res.Err())
	}
	for _, i := range []int{3, 30, 40} {
		checkGone(t, big, i)
	}
	if _, err := os.Lstat(c.NetnsPath(huge)); !os.IsNotExist(err) {
		t.Errorf("%s still there: %v", c.NetnsName(huge), err)
	}
	if !netns.IsMounted(filepath.Join(c.NetnsDir, lookalikes[0])) {
		t.Errorf("look-alike %s was touched", lookalikes[0])
	}
	if fi, err := os.Lstat(c.NetnsPath(32)); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("symlink look-alike touched: %v", err)
	}
	if b, err := os.ReadFile(c.NetnsPath(33)); err != nil || string(b) != "not a namespace" {
		t.Errorf("file look-alike touched: %q %v", b, err)
	}
	if sr, err := m.Survey(ctx); err != nil || len(sr.Inventory) != 0 {
		t.Errorf("left: %v, %v", sr, err)
	}
}

func maps(a, b slot.Inventory) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// Teardown hands the kernel a batch at a time, pausing in between, and
// the budget stops it between (or inside) batches.
func TestTeardownBatches(t *testing.T) {
	env := nettest.New(t, 16)
	m := env.Manager(t)
	ctx := context.Background()
	nettest.Leak(t, m, []int{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	inv, err := m.Scan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	res := m.Teardown(ctx, inv, slot.TeardownOptions{Batch: 3, MaxSlots: 5, BatchPause: 5 * time.Millisecond})
	if res.Batches != 2 || !slices.Equal(res.Reclaimed, []int{1, 2, 3, 4, 5}) || !slices.Equal(res.Deferred, []int{6, 7, 8, 9, 10}) {
		t.Errorf("budget 5, batch 3: %v, %d batches, reclaimed %v deferred %v", res, res.Batches, res.Reclaimed, res.Deferred)
	}
	if res.Timings.Pause <= 0 {
		t.Errorf("no pause between batches: %+v", res.Timings)
	}
	for i := 1; i <= 5; i++ {
		checkGone(t, m, i)
	}
	var calls []int
	res = m.Teardown(ctx, inv.Only(res.Deferred), slot.TeardownOptions{Batch: 2, Workers: 1,
		Progress: func(done, total int) { calls = append(calls, done) }})
	if res.Batches != 3 || !slices.Equal(res.Reclaimed, []int{6, 7, 8, 9, 10}) || !slices.Equal(calls, []int{1, 2, 3, 4, 5}) {
		t.Errorf("batch 2: %v, %d batches, progress %v", res, res.Batches, calls)
	}
	for i := 6; i <= 10; i++ {
		checkGone(t, m, i)
	}
	if links := nettest.HostLinks(t, m.Config().HostIfPrefix()); len(links) != 0 {
		t.Errorf("host links left: %v", links)
	}
}

// Halt stops a teardown at the end of the batch in hand: the slots started
// are finished whole (namespace, host link, firewall element), the rest is
// deferred untouched and nothing fails. A drain halts a background reclaim
// this way; cancelling ctx instead would cut the batch's wait short.
func TestTeardownHaltFinishesTheBatchInHand(t *testing.T) {
	m, inv := leakedSlots(t, 8)
	ctx := context.Background()
	halt := make(chan struct{})
	res := m.Teardown(ctx, inv, slot.TeardownOptions{Batch: 3, Workers: 1, Halt: halt,
		Progress: func(done, _ int) {
			if done == 2 { // in the middle of the first batch
				close(halt)
			}
		}})
	if len(res.Failed) != 0 || res.Batches != 1 || !slices.Equal(res.Reclaimed, []int{1, 2}) || !slices.Equal(res.Deferred, []int{3, 4, 5, 6, 7, 8}) {
		t.Fatalf("halted after 2: %v, %d batches, reclaimed %v deferred %v failed %v", res, res.Batches, res.Reclaimed, res.Deferred, res.Failed)
	}
	checkHalted(t, m, res, inv)
}

// Paced, the next batch is unlinked while the one before is awaited; a
// halt in the middle of that next batch finishes both whole and defers the
// rest untouched.
func TestTeardownPacedHaltFinishesTheBatchesInTheKernel(t *testing.T) {
	m, inv := leakedSlots(t, 8)
	ctx := context.Background()
	halt := make(chan struct{})
	var paced []slot.BatchDone
	res := m.Teardown(ctx, inv, slot.TeardownOptions{Batch: 3, Workers: 1, Halt: halt,
		Pace: func(last slot.BatchDone) (int, time.Duration) {
			paced = append(paced, last)
			return 3, 0
		},
		Progress: func(done, _ int) {
			if done == 5 { // in the middle of the second batch, unlinked before the first was awaited
				close(halt)
			}
		}})
	if len(res.Failed) != 0 || res.Batches != 2 || !slices.Equal(res.Reclaimed, []int{1, 2, 3, 4, 5}) || !slices.Equal(res.Deferred, []int{6, 7, 8}) {
		t.Fatalf("halted after 5: %v, %d batches, reclaimed %v deferred %v failed %v", res, res.Batches, res.Reclaimed, res.Deferred, res.Failed)
	}
	if len(paced) != 1 || paced[0].Slots != 3 || paced[0].Left != 3 {
		t.Errorf("paced %+v, want once, after the first batch of 3, with 3 not started", paced)
	}
	checkHalted(t, m, res, inv)
}

// Paced with Overlap saying no, a batch is awaited before the next one is
// unlinked: each Pace sees nothing of the next batch started yet; with
// Overlap saying yes, it sees the next batch already in the kernel (and
// is not asked once every batch is started).
func TestTeardownPacedOverlapAsked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		overlap bool
		// wantLeft is BatchDone.Left at each Pace: what was not yet
		// started when the batch before was done.
		wantLeft []int
	}{
		{"no overlap", false, []int{6, 3}},
		{"overlap", true, []int{3}}, // the third batch is started before the second is awaited: no Pace is left to ask
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, inv := leakedSlots(t, 9)
			ctx := context.Background()
			var left []int
			asked := 0
			res := m.Teardown(ctx, inv, slot.TeardownOptions{Batch: 3, Workers: 1,
				Pace: func(last slot.BatchDone) (int, time.Duration) {
					left = append(left, last.Left)
					return 3, 0
				},
				Overlap: func() bool { asked++; return tc.overlap }})
			if len(res.Failed) != 0 || len(res.Reclaimed) != 9 || res.Batches != 3 {
				t.Fatalf("teardown: reclaimed %v, failed %v, %d batches; want all 9 in 3", res.Reclaimed, res.Failed, res.Batches)
			}
			if asked == 0 {
				t.Error("Overlap never asked")
			}
			if !slices.Equal(left, tc.wantLeft) {
				t.Errorf("Left at each Pace = %v, want %v", left, tc.wantLeft)
			}
			for _, i := range res.Reclaimed {
				checkGone(t, m, i)
			}
		})
	}
}

// leakedSlots leaks slots 1..n on a manager of 16 slots and returns it with
// its scan of them.
func leakedSlots(t *testing.T, n int) (*slot.Manager, slot.Inventory) {
	t.Helper()
	m := nettest.New(t, 16).Manager(t)
	indices := make([]int, n)
	for k := range indices {
		indices[k] = k + 1
	}
	nettest.Leak(t, m, indices)
	inv, err := m.Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return m, inv
}

// checkHalted checks a halted teardown on the host: its reclaimed slots
// gone, its deferred ones exactly what is left, each as it was in before.
func checkHalted(t *testing.T, m *slot.Manager, res *slot.TeardownResult, before slot.Inventory) {
	t.Helper()
	for _, i := range res.Reclaimed {
		checkGone(t, m, i)
	}
	left, err := m.Scan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got := left.Indices(); !slices.Equal(got, res.Deferred) {
		t.Errorf("left on the host: %v, want the deferred %v whole", got, res.Deferred)
	}
	for _, i := range res.Deferred {
		if left[i] != before[i] {
			t.Errorf("slot %d: %v after the halt, %v before: a deferred slot was touched", i, left[i], before[i])
		}
	}
}
