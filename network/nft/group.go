package nft

import (
	"fmt"
	"sync"

	"github.com/google/nftables"
)

// group commits the policy changes and new slots' elements of concurrent
// callers together.
//
// The kernel checks a table at the commit of every transaction that adds
// a rule: it walks every chain reachable from the base chains, each
// lease's egress chain among them, so a policy change with 10,000 leases
// costs milliseconds however small it is, and the kernel's commit lock is
// held meanwhile. Changes that arrive while a commit is under way wait
// for it and then go in one transaction together: N of them pay one walk
// (docs/BENCHMARKS.md, "The per-slot host rules"). A new slot's element
// needs no walk, but would wait for the kernel's commit lock behind them
// all the same: it goes in their transactions. A lone caller commits at
// once.
//
// The first caller of a batch commits it in its own goroutine, and hands
// the next batch to the first caller waiting in it: no goroutine of the
// group's own, and no caller commits more than one batch.
type group struct {
	mu    sync.Mutex
	busy  bool      // a batch is being committed
	queue []*change // the changes waiting for the next commit
}

// change is one caller's part of a transaction.
type change struct {
	what string // what it writes, for its error
	// add adds the change to c's transaction; ids numbers the anonymous
	// sets it adds, unique within the transaction.
	add  func(c *nftables.Conn, ids *setIDs) error
	done chan error    // its outcome, sent once
	lead chan struct{} // closed when it is to commit the next batch
}

// setIDs hands out the transaction-local ids of anonymous sets: a rule
// names a set added in the same transaction by its id, unique within the
// transaction, so that no change's rule can be given another change's
// set (the kernel takes the latest set made with an id, which would be
// right in the order the changes are added, but is not a thing to lean on).
type setIDs struct{ last uint32 }

func (s *setIDs) next() uint32 { s.last++; return s.last }

// do adds the change to the next transaction of t and returns its
// outcome. It returns only once the change is committed or refused: a
// transaction in the kernel cannot be called back.
func (g *group) do(t *Table, what string, add func(c *nftables.Conn, ids *setIDs) error) error {
	ch := &change{what: what, add: add, done: make(chan error, 1), lead: make(chan struct{})}
	g.mu.Lock()
	g.queue = append(g.queue, ch)
	if !g.busy {
		g.busy = true
		close(ch.lead)
	}
	g.mu.Unlock()
	select {
	case err := <-ch.done:
		return err
	case <-ch.lead:
	}
	g.mu.Lock()
	batch := g.queue
	g.queue = nil
	g.mu.Unlock()

	t.commit(batch)

	g.mu.Lock()
	if len(g.queue) > 0 {
		close(g.queue[0].lead)
	} else {
		g.busy = false
	}
	g.mu.Unlock()
	return <-ch.done
}

// commit commits batch in one transaction and tells each change its
// outcome. When the transaction fails, or a change cannot be added to it,
// each change is committed again alone, so that each hears its own
// outcome and one caller's refused change costs no other caller its own.
func (t *Table) commit(batch []*change) {
	if len(batch) > 1 {
		if t.commitTogether(batch) == nil {
			for _, ch := range batch {
				ch.done <- nil
			}
			return
		}
	}
	for _, ch := range batch {
		ch.done <- t.commitTogether([]*change{ch})
	}
}

// commitTogether commits changes in one transaction.
func (t *Table) commitTogether(changes []*change) error {
	c, release, err := t.conn()
	if err != nil {
		return err
	}
	defer release()
	var ids setIDs
	for _, ch := range changes {
		if err := ch.add(c, &ids); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		if len(changes) == 1 {
			return fmt.Errorf("nft: write %s/%s: %w", t.name, changes[0].what, err)
		}
		return fmt.Errorf("nft: write %d changes of %s: %w", len(changes), t.name, err)
	}
	return nil
}
