package eventlog_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	"github.com/phasegate/phasegate/internal/eventlog"
)

// log is an append-only log of ints on eventlog's parts.
type log struct {
	mu    sync.Mutex
	items []int
	ended bool
	wake  eventlog.Wake
}

func (l *log) add(v int, end bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.items = append(l.items, v)
	l.ended = end
	l.wake.Signal()
}

func (l *log) since(after uint64) ([]int, <-chan struct{}, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return eventlog.Since(l.items, after, l.ended, &l.wake)
}

// A follower from a position gets what is there, then each item appended
// while it waits, and its channel closes once the log ends.
func TestFollowFromAPositionToTheEnd(t *testing.T) {
	l := &log{}
	l.add(1, false)
	l.add(2, false)
	ch := eventlog.Follow(context.Background(), 1, l.since)
	if got := <-ch; got != 2 {
		t.Fatalf("first item %d, want 2 (the one after position 1)", got)
	}
	l.add(3, false)
	l.add(4, true)
	var rest []int
	for v := range ch {
		rest = append(rest, v)
	}
	if !slices.Equal(rest, []int{3, 4}) {
		t.Fatalf("then %v, want [3 4] and the end", rest)
	}
}

// A follower whose ctx ends stops, its channel closed, though the log goes on.
func TestFollowEndsWithItsContext(t *testing.T) {
	l := &log{}
	ctx, cancel := context.WithCancel(context.Background())
	ch := eventlog.Follow(ctx, 0, l.since)
	cancel()
	for range ch {
		t.Fatal("an item from an empty log")
	}
}

// A batch shares the log's array but an append never writes into it.
func TestSinceBatchIsCapped(t *testing.T) {
	var w eventlog.Wake
	items := make([]int, 2, 8)
	batch, _, _ := eventlog.Since(items, 1, false, &w)
	_ = append(batch, 9)
	if items = items[:3]; items[2] == 9 {
		t.Fatal("appending to a batch wrote into the log")
	}
}
