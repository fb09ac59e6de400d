package slot

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/phasegate/phasegate/network/account"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
)

// Resources says which of a slot's host resources exist.
type Resources uint8

// The resources of a slot.
const (
	// HasNetns: the netns file <NetnsDir>/<Prefix><i> exists.
	HasNetns Resources = 1 << iota
	// HasHostLink: the link <Prefix>h<i> exists in the root namespace.
	HasHostLink
	// HasElement: <Prefix>h<i> is an element of the nftables set.
	HasElement

	// HasShaper: the ifb <Prefix>b<i> of a lease's bandwidth limits
	// exists (package network/shape). A survey finds it; [Assume] does
	// not assume it, as looking up a missing link by name costs what
	// Teardown avoids (see link.go): [AssumeOf] does for a slot whose
	// Extra says so.
	HasShaper

	// All is every resource a slot has without bandwidth limits.
	All = HasNetns | HasHostLink | HasElement
)

// String lists the resources, e.g. "netns+link".
func (r Resources) String() string {
	var parts []string
	if r&HasNetns != 0 {
		parts = append(parts, "netns")
	}
	if r&HasHostLink != 0 {
		parts = append(parts, "link")
	}
	if r&HasElement != 0 {
		parts = append(parts, "element")
	}
	if r&HasShaper != 0 {
		parts = append(parts, "ifb")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "+")
}

// Inventory maps slot indices to the resources that exist for them. Only
// names with the configured prefix and an index in canonical form are ever
// in it, indices beyond Config.Slots included (left by a run with a larger
// Slots; see ScanResult.Beyond). A netns entry must be a bound network
// namespace or an empty regular file (see netns.Inspect): symlinks,
// directories, files with content and mounts of anything else are foreign.
type Inventory map[int]Resources

// Indices returns the inventory's indices in ascending order.
func (inv Inventory) Indices() []int {
	return slices.Sorted(maps.Keys(inv))
}

// Only returns the part of the inventory for the given indices.
func (inv Inventory) Only(indices []int) Inventory {
	out := make(Inventory, len(indices))
	for _, i := range indices {
		if r, ok := inv[i]; ok {
			out[i] = r
		}
	}
	return out
}

// Beyond returns the indices of the inventory greater than slots, ascending.
func (inv Inventory) Beyond(slots int) []int {
	var out []int
	for i := range inv {
		if i > slots {
			out = append(out, i)
		}
	}
	slices.Sort(out)
	return out
}

// Assume returns an inventory that assumes every resource exists for the
// given indices, for tearing down slots this process made. Teardown copes
// with resources that turn out to be missing.
func Assume(indices ...int) Inventory {
	out := make(Inventory, len(indices))
	for _, i := range indices {
		out[i] = All
	}
	return out
}

// AssumeOf is [Assume] for slots this process made and is handed back:
// each has All and what its Extra says.
func AssumeOf(ss ...*Slot) Inventory {
	out := make(Inventory, len(ss))
	for _, s := range ss {
		out[s.Index] = All | s.Extra
	}
	return out
}

// Unreadable is a netns entry at one of our canonical names that could not
// be inspected (an error other than "not a namespace"). Its state is
// unknown, so its index is left out of the inventory: it is never torn down,
// and an index in [1, Slots] must stay quarantined until a later scan can
// read it.
type Unreadable struct {
	Index int
	Name  string
	Err   error
}

// ScanResult is what a survey of the host found for one configuration.
type ScanResult struct {
	// Inventory is what is ours, by index: indices in [1, Slots], and
	// canonical indices beyond Slots.
	Inventory Inventory
	// Beyond are the indices of Inventory greater than Config.Slots,
	// ascending: slots of a run with a larger Config.Slots. The allocator never
	// hands them out (it covers [1, Slots] only); reclaim and the
	// reconciler tear them down.
	Beyond []int
	// Unreadable are the netns entries that could not be inspected,
	// ascending by index. None of them is in Inventory.
	Unreadable []Unreadable
	// Bound is the identity of the namespace bound at each index's netns
	// file, for the indices of Inventory whose file has one (HasNetns
	// without an entry here is an empty file, nothing mounted on it):
	// read from the same mountinfo, so that a caller can check a recorded
	// slot's namespace without a system call of its own.
	Bound map[int]netns.ID
	// Links are the host's links as the scan read them, with their
	// counters (a lease's account reads its slot's from them).
	Links *account.NetDev
}

// Quarantine returns the indices in [1, slots] that must not be handed out
// whatever happens to the inventory: those of Unreadable, ascending.
func (r *ScanResult) Quarantine(slots int) []int {
	var out []int
	for _, u := range r.Unreadable {
		if u.Index <= slots {
			out = append(out, u.Index)
		}
	}
	return slices.Compact(out)
}

// UnreadableError is returned by Scan when some netns entries could not be
// inspected; Survey returns them in ScanResult.Unreadable instead.
type UnreadableError struct {
	Entries []Unreadable
}

// Error implements error.
func (e *UnreadableError) Error() string {
	if len(e.Entries) == 0 {
		return "slot: scan: unreadable netns entries"
	}
	return fmt.Sprintf("slot: scan: %d netns entr(ies) could not be inspected, first %s: %v",
		len(e.Entries), e.Entries[0].Name, e.Entries[0].Err)
}

// Unwrap returns the entries' errors.
func (e *UnreadableError) Unwrap() []error {
	out := make([]error, len(e.Entries))
	for k, u := range e.Entries {
		out[k] = u.Err
	}
	return out
}

// Survey lists what exists on the host for this configuration: netns
// files, host links and set elements with our canonical names, in [1,
// Slots] and beyond, and the netns entries that could not be inspected.
// Look-alikes are left out. Its cost is linear in what it lists: one read of
// the netns directory and of mountinfo (see netns.Survey), one read of
// /proc/net/dev, one dump of the set.
//
// The indices in [1, Slots] it finds without anything of a slot are known
// to the manager from then on as free of one (see [Manager.Surveyed]).
func (m *Manager) Survey(ctx context.Context) (*ScanResult, error) {
	r, err := survey(ctx, m.cfg, m.fw, netns.Survey)
	if err != nil {
		return nil, err
	}
	m.Surveyed(r)
	return r, nil
}

// Surveyed tells the manager what a survey of its configuration found
// (one by the package's [Survey] made before the manager, so that nothing
// on the host changed until the survey was done): the indices in [1,
// Slots] without anything of a slot are free of one, so that a later
// Create there shares the conntrack clean-up of the others (see Create).
func (m *Manager) Surveyed(r *ScanResult) {
	unread := map[int]bool{}
	for _, u := range r.Unreadable {
		unread[u.Index] = true
	}
	var empty []int
	for i := 1; i <= m.cfg.Slots; i++ {
		if _, ok := r.Inventory[i]; !ok && !unread[i] {
			empty = append(empty, i)
		}
	}
	m.ct.goneIfUnknown(empty)
}

// Scan is Survey's inventory. If some netns entries could not be inspected
// it returns an *UnreadableError and no inventory: use Survey to go on with
// the rest.
func (m *Manager) Scan(ctx context.Context) (Inventory, error) {
	return scanOnly(m.Survey(ctx))
}

// Survey is Manager.Survey without a manager: it changes nothing on the
// host (it neither prepares the netns directory nor creates the firewall
// table), so it suits a dry run. A missing directory or table lists
// nothing.
func Survey(ctx context.Context, cfg Config) (*ScanResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	fw, err := nft.New(cfg.TableName())
	if err != nil {
		return nil, err
	}
	if ok, err := fw.Exists(ctx); err != nil {
		return nil, err
	} else if !ok {
		fw = nil
	}
	return survey(ctx, cfg, fw, netns.Survey)
}

// Scan is Survey's inventory, like Manager.Scan.
func Scan(ctx context.Context, cfg Config) (Inventory, error) {
	return scanOnly(Survey(ctx, cfg))
}

func scanOnly(r *ScanResult, err error) (Inventory, error) {
	if err != nil {
		return nil, err
	}
	if len(r.Unreadable) > 0 {
		return nil, &UnreadableError{Entries: r.Unreadable}
	}
	return r.Inventory, nil
}

// surveyFunc is netns.Survey (tests substitute failures).
type surveyFunc func(dir string, match func(name string) bool) ([]netns.Found, error)

// survey is Survey with fw nil when there is no table. The three listings
// are independent and mostly kernel time, so they run at once: with an idle
// core the scan costs about the longest of them rather than their sum
// (figures: docs/BENCHMARKS.md).
func survey(ctx context.Context, cfg Config, fw *nft.Table, list surveyFunc) (*ScanResult, error) {
	var (
		wg              sync.WaitGroup
		links           *account.NetDev
		els             []string
		linksErr, elErr error
	)
	wg.Go(func() { links, linksErr = listLinks() })
	if fw != nil {
		wg.Go(func() { els, elErr = fw.List(ctx) })
	}
	found, err := list(cfg.NetnsDir, func(name string) bool {
		_, ok := cfg.CanonicalNetnsIndex(name)
		return ok
	})
	wg.Wait()
	if err != nil {
		return nil, fmt.Errorf("slot: scan: %w", err)
	}
	if err := errors.Join(linksErr, elErr, ctx.Err()); err != nil {
		return nil, err
	}

	inv := Inventory{}
	res := &ScanResult{Inventory: inv, Bound: make(map[int]netns.ID, len(found)), Links: links}
	for _, f := range found {
		i, ok := cfg.CanonicalNetnsIndex(f.Name)
		switch {
		case !ok || errors.Is(f.Err, netns.ErrNotNamespace):
			// A look-alike: never ours.
		case f.Err != nil:
			res.Unreadable = append(res.Unreadable, Unreadable{Index: i, Name: f.Name, Err: f.Err})
		default:
			inv[i] |= HasNetns
			if f.State == netns.Bound {
				res.Bound[i] = f.ID
			}
		}
	}
	for _, name := range links.Names() {
		if i, ok := cfg.CanonicalHostIfIndex(name); ok {
			inv[i] |= HasHostLink
		} else if i, ok := cfg.CanonicalShaperIfIndex(name); ok {
			inv[i] |= HasShaper
		}
	}
	for _, name := range els {
		if i, ok := cfg.CanonicalHostIfIndex(name); ok {
			inv[i] |= HasElement
		}
	}
	// What cannot be inspected is not torn down, whatever else the index
	// has: tearing down its link and element would free an index whose
	// netns entry is unknown.
	slices.SortFunc(res.Unreadable, func(a, b Unreadable) int { return a.Index - b.Index })
	for _, u := range res.Unreadable {
		delete(inv, u.Index)
		delete(res.Bound, u.Index)
	}
	res.Beyond = inv.Beyond(cfg.Slots)
	return res, nil
}
