package nft

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"
)

func key(name string) ([]byte, error) {
	if name == "" || len(name) >= ifNameSize {
		return nil, fmt.Errorf("nft: invalid interface name %q", name)
	}
	k := make([]byte, ifNameSize)
	copy(k, name)
	return k, nil
}

func elements(names []string) ([]nftables.SetElement, error) {
	els := make([]nftables.SetElement, 0, len(names))
	for _, n := range names {
		k, err := key(n)
		if err != nil {
			return nil, err
		}
		els = append(els, nftables.SetElement{Key: k})
	}
	return els, nil
}

// List returns the interface names in the set, sorted. A missing table gives
// an empty list.
func (t *Table) List(ctx context.Context) ([]string, error) {
	return t.names(ctx, t.set())
}

func (t *Table) list(ctx context.Context, c *nftables.Conn) ([]string, error) {
	return t.keys(ctx, c, t.set())
}

// names returns the interface names set (the slots set or the egress map)
// is keyed by, sorted, on a connection of its own.
func (t *Table) names(ctx context.Context, set *nftables.Set) ([]string, error) {
	c, release, err := t.connFor(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	return t.keys(ctx, c, set)
}

// keys returns the interface names set is keyed by, sorted; none when the
// table is missing.
func (t *Table) keys(ctx context.Context, c *nftables.Conn, set *nftables.Set) ([]string, error) {
	els, err := t.elements(ctx, c, set)
	if err != nil {
		return nil, err
	}
	return elementNames(els), nil
}

// elements returns the elements of set; none when the table is missing.
func (t *Table) elements(ctx context.Context, c *nftables.Conn, set *nftables.Set) ([]nftables.SetElement, error) {
	els, err := c.GetSetElements(set)
	if err != nil {
		// The library does not always wrap the errno: ask whether the
		// table is there at all.
		if ok, xerr := t.Exists(ctx); errors.Is(err, unix.ENOENT) || (xerr == nil && !ok) {
			return nil, nil
		}
		return nil, fmt.Errorf("nft: list %s/%s: %w", t.name, set.Name, err)
	}
	return els, nil
}

// Add adds interface names to the set in one transaction, and to the
// table's stamp set (WithStamp). Names already in the set are fine.
func (t *Table) Add(ctx context.Context, names ...string) error {
	return t.add(ctx, names, false)
}

// AddNew adds the interface names of new slots to the set and removes any
// egress chain left under those names, in one transaction: a new slot
// starts with no policy, whatever a slot at its index once had.
func (t *Table) AddNew(ctx context.Context, names ...string) error {
	return t.add(ctx, names, true)
}

func (t *Table) add(ctx context.Context, names []string, clean bool) error {
	if len(names) == 0 {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	els, err := elements(names)
	if err != nil {
		return err
	}
	var stale []string
	if clean {
		if stale, err = t.withEgress(names); err != nil {
			return err
		}
	}
	// In the policy changes' transactions (group): it would wait for
	// the kernel's commit lock behind theirs anyway, each of which checks
	// the whole table.
	return t.changes.do(t, fmt.Sprintf("%d element(s) of set %s", len(names), SetName), func(c *nftables.Conn, _ *setIDs) error {
		for chunk := range slices.Chunk(els, elemsPerMessage) {
			if err := c.SetAddElements(t.set(), chunk); err != nil {
				return fmt.Errorf("nft: encode elements: %w", err)
			}
			if st := t.stampSet(); st != nil {
				if err := c.SetAddElements(st, chunk); err != nil {
					return fmt.Errorf("nft: encode elements: %w", err)
				}
			}
		}
		return t.clearEgress(c, stale)
	})
}

// Remove removes interface names from the set, with their egress chains, in
// one transaction. Names not in the set are skipped: with more than one
// name the set and the egress map are listed first and only what is there
// is removed (retrying if they changed meanwhile); a single name's element
// is removed whether or not it is there, its egress chain if it has one. A
// missing table is success.
func (t *Table) Remove(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	c, release, err := t.connFor(ctx)
	if err != nil {
		return err
	}
	defer release()
	if len(names) == 1 {
		chains, err := t.withEgress(names)
		if err != nil {
			return err
		}
		err = t.remove(c, names, chains, false)
		if errors.Is(err, unix.ENOENT) {
			return nil // no table
		}
		return err
	}
	var last error
	for range 3 {
		present, err := t.list(ctx, c)
		if err != nil {
			return err
		}
		chains, err := t.egressNames(ctx, c)
		if err != nil {
			return err
		}
		last = t.remove(c, only(names, present), only(names, chains), true)
		if !errors.Is(last, unix.ENOENT) {
			return last
		}
	}
	return last
}

// remove removes the elements els and the egress chains of chains (which
// are there) in one transaction; present says the elements are known to be
// there too.
func (t *Table) remove(c *nftables.Conn, els, chains []string, present bool) error {
	if len(els) == 0 && len(chains) == 0 {
		return nil
	}
	keys, err := elements(els)
	if err != nil {
		return err
	}
	set := t.set()
	if !present {
		// Added first, so that deleting one that is not there is a no-op
		// rather than a failed transaction (see clearEgress).
		if err := c.SetAddElements(set, keys); err != nil {
			return fmt.Errorf("nft: encode elements: %w", err)
		}
	}
	for chunk := range slices.Chunk(keys, elemsPerMessage) {
		if err := c.SetDeleteElements(set, chunk); err != nil {
			return fmt.Errorf("nft: encode elements: %w", err)
		}
	}
	// The elements and every chain's map element in one transaction, with
	// the first chains; the other chains, unreachable from then on, in
	// transactions of their own (chainsPerTx).
	if err := t.unmap(c, chains); err != nil {
		return err
	}
	per := t.chainsPerTx()
	first := chains[:min(len(chains), per)]
	t.dropChains(c, first)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: remove %d element(s) and %d egress chain(s) in %s: %w", len(els), len(chains), t.name, err)
	}
	for part := range slices.Chunk(chains[len(first):], per) {
		t.dropChains(c, part)
		if err := c.Flush(); err != nil {
			return fmt.Errorf("nft: remove %d egress chain(s) in %s: %w", len(part), t.name, err)
		}
	}
	return nil
}

// only returns the names that are in present, each once.
func only(names, present []string) []string {
	have := make(map[string]bool, len(present))
	for _, p := range present {
		have[p] = true
	}
	var out []string
	for _, n := range names {
		if have[n] {
			out = append(out, n)
			delete(have, n) // no duplicates in one batch
		}
	}
	return out
}
