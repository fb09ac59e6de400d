package nft

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// Stamps. A table made WithStamp(s) keeps, beside the slots set, a set
// named stamp_<s> of the interface names of every slot added under that
// stamp (Add, AddNew), in the same transaction. The daemon's stamp is the
// generation of the records the slots are made under, so that a slot
// made under records that are gone is told from one made by something
// that kept none (docs/DESIGN.md section 6).
//
// A set of its own rather than a comment on each element of the slots
// set: a comment rides in every dump of the slots set, which every survey
// makes, and made the dump of 10,000 elements 1.4 to 2.6 times slower
// (docs/BENCHMARKS.md, "When the records cannot vouch"); the stamp sets
// are read only when a start finds slots no record names. Names are never
// taken out of a stamp set when their slot goes: a name in it says only
// that a slot of that name was once made under that stamp.

// stampSetPrefix begins the name of a stamp set.
const stampSetPrefix = "stamp_"

// WithStamp has Add and AddNew put every name they add in the table's
// stamp set of stamp (1 to 64 letters, digits and underscores), made by
// Ensure.
func WithStamp(stamp string) Option {
	return func(t *Table) { t.stamp = stamp }
}

func validStamp(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_') {
			return false
		}
	}
	return true
}

// stampSet is the table's stamp set; nil without a stamp. Its key carries
// the byte order nft needs to print names, as the slots set's does.
func (t *Table) stampSet() *nftables.Set {
	if t.stamp == "" {
		return nil
	}
	return t.namedStampSet(stampSetPrefix + t.stamp)
}

func (t *Table) namedStampSet(name string) *nftables.Set {
	return &nftables.Set{Table: t.table(), Name: name, ID: 7, KeyType: nftables.TypeIFName, KeyByteOrder: binaryutil.NativeEndian}
}

// ensureStampSet makes the table's stamp set if it has a stamp and the
// set is not there: a start with a new stamp (a new store) on a table an
// earlier run wrote. One GET of the set, no transaction, when it is
// there: a transaction on a table with thousands of egress chains is
// not free.
func (t *Table) ensureStampSet(c *nftables.Conn) error {
	st := t.stampSet()
	if st == nil {
		return nil
	}
	_, err := t.get(unix.NFT_MSG_GETSET, []mnl.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: []byte(t.name + "\x00")},
		{Type: unix.NFTA_SET_NAME, Data: []byte(st.Name + "\x00")},
	})
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, unix.ENOENT):
		return fmt.Errorf("nft: get set %s/%s: %w", t.name, st.Name, err)
	}
	c.AddTable(t.table())
	if err := c.AddSet(st, nil); err != nil {
		return fmt.Errorf("nft: add set %s: %w", st.Name, err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: add set %s to %s: %w", st.Name, t.name, err)
	}
	return nil
}

// Stamps returns, by interface name, the stamp each name was added under,
// of every stamp set of the table but its own: the slots made under other
// stamps than the handle's. It lists the table's sets (a dump of their
// names, however many elements they hold) and dumps only those sets, so
// that it costs next to nothing when there are none; a name in several
// is given any of them. A missing table has none.
func (t *Table) Stamps(ctx context.Context) (map[string]string, error) {
	c, release, err := t.connFor(ctx)
	if err != nil {
		return nil, err
	}
	defer release()
	others, err := t.otherStampSets(ctx, c)
	if err != nil || len(others) == 0 {
		return nil, err
	}
	out := map[string]string{}
	for _, name := range others {
		els, err := t.elements(ctx, c, t.namedStampSet(name))
		if err != nil {
			return nil, err
		}
		for _, e := range els {
			out[keyName(e.Key)] = strings.TrimPrefix(name, stampSetPrefix)
		}
	}
	return out, nil
}

// otherStampSets names the table's stamp sets but its own.
func (t *Table) otherStampSets(ctx context.Context, c *nftables.Conn) ([]string, error) {
	sets, err := c.GetSets(t.table())
	if err != nil {
		if ok, xerr := t.Exists(ctx); errors.Is(err, unix.ENOENT) || (xerr == nil && !ok) {
			return nil, nil
		}
		return nil, fmt.Errorf("nft: list the sets of %s: %w", t.name, err)
	}
	var out []string
	for _, s := range sets {
		if strings.HasPrefix(s.Name, stampSetPrefix) && (t.stamp == "" || s.Name != stampSetPrefix+t.stamp) {
			out = append(out, s.Name)
		}
	}
	return out, nil
}

// DropStamps deletes every stamp set but the table's own, in one
// transaction: once the slots they name are dealt with (held, recorded,
// or reclaimed), what they told is no longer needed.
func (t *Table) DropStamps(ctx context.Context) error {
	c, release, err := t.connFor(ctx)
	if err != nil {
		return err
	}
	defer release()
	others, err := t.otherStampSets(ctx, c)
	if err != nil || len(others) == 0 {
		return err
	}
	for _, name := range others {
		c.DelSet(t.namedStampSet(name))
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: delete %d stamp sets of %s: %w", len(others), t.name, err)
	}
	return nil
}
