package nft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	mnl "github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// SetName is the name of the interface-name set in every table.
const SetName = "slots"

// ifNameSize is IFNAMSIZ: set keys are interface names padded to 16 bytes.
const ifNameSize = 16

// elemsPerMessage bounds the elements in one netlink message: the element
// list is one attribute and attributes are limited to 64 KiB.
const elemsPerMessage = 1024

// sockBuf is the netlink socket buffer asked for, so that one batch with
// thousands of elements goes in one write.
const sockBuf = 8 << 20

// TableName derives the table name from a slot prefix: "phasegate_" and the
// prefix with every byte outside [A-Za-z0-9_] replaced by '_'.
func TableName(prefix string) string {
	var b strings.Builder
	b.WriteString("phasegate_")
	for i := 0; i < len(prefix); i++ {
		c := prefix[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
			b.WriteByte(c)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Table is a handle on one per-prefix inet table. It holds no socket: every
// method opens a netlink socket for its own transaction and closes it. A
// Table is safe for concurrent use.
type Table struct {
	name string
}

// New returns a handle on the inet table called name. Nothing is created
// until Ensure.
func New(name string) (*Table, error) {
	if name == "" || len(name) > 255 {
		return nil, fmt.Errorf("nft: invalid table name %q", name)
	}
	return &Table{name: name}, nil
}

// Name returns the table's name.
func (t *Table) Name() string { return t.name }

func (t *Table) table() *nftables.Table {
	return &nftables.Table{Name: t.name, Family: nftables.TableFamilyINet}
}

func (t *Table) set() *nftables.Set {
	// A fixed, non-zero ID keeps the library from using its global counter.
	return &nftables.Set{Table: t.table(), Name: SetName, ID: 1, KeyType: nftables.TypeIFName}
}

func conn() (*nftables.Conn, error) {
	c, err := nftables.New(nftables.WithSockOptions(func(c *mnl.Conn) error {
		_ = c.SetWriteBuffer(sockBuf) // best effort
		_ = c.SetReadBuffer(sockBuf)
		return nil
	}))
	if err != nil {
		return nil, fmt.Errorf("nft: open netlink: %w", err)
	}
	return c, nil
}

// Exists reports whether the table exists with its set.
func (t *Table) Exists(ctx context.Context) (bool, error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	c, err := conn()
	if err != nil {
		return false, err
	}
	if _, err := c.GetSetByName(t.table(), SetName); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("nft: get set %s/%s: %w", t.name, SetName, err)
	}
	return true, nil
}

// Ensure creates the table, its set, chains and rules if the table does not
// exist with its set yet. An incomplete table (no set) is replaced. Existing
// elements of a complete table are kept. Ensure is idempotent.
func (t *Table) Ensure(ctx context.Context) error {
	ok, err := t.Exists(ctx)
	if err != nil || ok {
		return err
	}
	c, err := conn()
	if err != nil {
		return err
	}
	tbl := t.table()
	// Drop a half-made table first (add+delete in one batch never fails on
	// a missing table).
	c.AddTable(tbl)
	c.DelTable(tbl)
	c.AddTable(tbl)
	set := t.set()
	if err := c.AddSet(set, nil); err != nil {
		return fmt.Errorf("nft: add set: %w", err)
	}
	accept := policy(nftables.ChainPolicyAccept)
	fwd := c.AddChain(&nftables.Chain{
		Name: "forward", Table: tbl, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: accept,
	})
	post := c.AddChain(&nftables.Chain{
		Name: "postrouting", Table: tbl, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: accept,
	})
	lookup := func(key expr.MetaKey, invert bool) []expr.Any {
		return []expr.Any{
			&expr.Meta{Key: key, Register: 1},
			&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: invert},
		}
	}
	c.AddRule(&nftables.Rule{Table: tbl, Chain: fwd, Exprs: append(lookup(expr.MetaKeyIIFNAME, false),
		&expr.Verdict{Kind: expr.VerdictAccept})})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: fwd, Exprs: append(lookup(expr.MetaKeyOIFNAME, false),
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Verdict{Kind: expr.VerdictAccept})})
	c.AddRule(&nftables.Rule{Table: tbl, Chain: post, Exprs: append(append(lookup(expr.MetaKeyIIFNAME, false),
		lookup(expr.MetaKeyOIFNAME, true)...), &expr.Masq{})})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nft: create table inet %s: %w", t.name, err)
	}
	return nil
}

func policy(p nftables.ChainPolicy) *nftables.ChainPolicy { return &p }

// Delete removes the table with everything in it. A missing table is not an
// error.
func (t *Table) Delete(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c, err := conn()
	if err != nil {
		return err
	}
	c.DelTable(t.table())
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("nft: delete table inet %s: %w", t.name, err)
	}
	return nil
}

// RuleCount returns the number of rules in the table's chains.
func (t *Table) RuleCount(ctx context.Context) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	c, err := conn()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, ch := range []string{"forward", "postrouting"} {
		rules, err := c.GetRules(t.table(), &nftables.Chain{Name: ch, Table: t.table()})
		if err != nil {
			return 0, fmt.Errorf("nft: list rules %s/%s: %w", t.name, ch, err)
		}
		n += len(rules)
	}
	return n, nil
}

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
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := conn()
	if err != nil {
		return nil, err
	}
	els, err := c.GetSetElements(t.set())
	if err != nil {
		// The library does not always wrap the errno: ask whether the set
		// is there at all.
		if ok, xerr := t.Exists(ctx); errors.Is(err, unix.ENOENT) || (xerr == nil && !ok) {
			return nil, nil
		}
		return nil, fmt.Errorf("nft: list set %s/%s: %w", t.name, SetName, err)
	}
	out := make([]string, 0, len(els))
	for _, e := range els {
		n := string(e.Key)
		if i := strings.IndexByte(n, 0); i >= 0 {
			n = n[:i]
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// Add adds interface names to the set in one transaction. Names already in
// the set are fine.
func (t *Table) Add(ctx context.Context, names ...string) error {
	return t.change(ctx, names, true)
}

// Remove removes interface names from the set in one transaction. Names not
// in the set are skipped: with more than one name the set is listed first and
// only present names are removed (retrying if the set changed meanwhile); a
// single missing name is simply success. A missing table is success.
func (t *Table) Remove(ctx context.Context, names ...string) error {
	if len(names) == 0 {
		return nil
	}
	if len(names) == 1 {
		err := t.change(ctx, names, false)
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	var last error
	for range 3 {
		present, err := t.List(ctx)
		if err != nil {
			return err
		}
		have := make(map[string]bool, len(present))
		for _, p := range present {
			have[p] = true
		}
		var del []string
		for _, n := range names {
			if have[n] {
				del = append(del, n)
				delete(have, n) // no duplicates in one batch
			}
		}
		last = t.change(ctx, del, false)
		if !errors.Is(last, unix.ENOENT) {
			return last
		}
	}
	return last
}

func (t *Table) change(ctx context.Context, names []string, add bool) error {
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
	c, err := conn()
	if err != nil {
		return err
	}
	set := t.set()
	for chunk := range slices.Chunk(els, elemsPerMessage) {
		if add {
			err = c.SetAddElements(set, chunk)
		} else {
			err = c.SetDeleteElements(set, chunk)
		}
		if err != nil {
			return fmt.Errorf("nft: encode elements: %w", err)
		}
	}
	if err := c.Flush(); err != nil {
		op := "remove"
		if add {
			op = "add"
		}
		return fmt.Errorf("nft: %s %d element(s) in %s/%s: %w", op, len(names), t.name, SetName, err)
	}
	return nil
}
