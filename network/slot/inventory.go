package slot

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/nft"
)

// Resources says which of a slot's three host resources exist.
type Resources uint8

// The resources of a slot.
const (
	// HasNetns: the netns file <NetnsDir>/<Prefix><i> exists.
	HasNetns Resources = 1 << iota
	// HasHostLink: the link <Prefix>h<i> exists in the root namespace.
	HasHostLink
	// HasElement: <Prefix>h<i> is an element of the nftables set.
	HasElement

	// All is every resource.
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
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, "+")
}

// Inventory maps slot indices to the resources that exist for them. Only
// names with the configured prefix and a canonical index in [1, Slots] are
// ever in it; a netns entry must be a bound namespace or an empty regular
// file (see netns.Inspect): symlinks, directories, files with content and
// mounts of anything else are foreign.
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

// Scan lists what exists on the host for this configuration: netns files,
// host links and set elements. Foreign names are left out.
func (m *Manager) Scan(ctx context.Context) (Inventory, error) {
	return scan(ctx, m.cfg, m.fw)
}

// Scan lists what exists on the host for cfg's slots, like Manager.Scan,
// without changing anything: it neither prepares the netns directory nor
// creates the firewall table, so it suits a dry run. A missing directory or
// table lists nothing.
func Scan(ctx context.Context, cfg Config) (Inventory, error) {
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
	return scan(ctx, cfg, fw)
}

// scan is Scan with fw nil when there is no table.
func scan(ctx context.Context, cfg Config, fw *nft.Table) (Inventory, error) {
	inv := Inventory{}
	entries, err := netns.List(cfg.NetnsDir, cfg.Prefix)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.Kind != netns.KindFile {
			continue
		}
		if i, ok := cfg.ParseNetnsName(e.Name); ok {
			// Only a bound namespace or a placeholder is ours; a file
			// with content or a mount of something else is foreign.
			if st, err := netns.Inspect(cfg.NetnsPath(i)); err == nil && st != netns.Missing {
				inv[i] |= HasNetns
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	links, err := listLinks()
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		if i, ok := cfg.ParseHostIfName(l.name); ok {
			inv[i] |= HasHostLink
		}
	}
	if fw == nil {
		return inv, nil
	}
	els, err := fw.List(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range els {
		if i, ok := cfg.ParseHostIfName(n); ok {
			inv[i] |= HasElement
		}
	}
	return inv, nil
}
