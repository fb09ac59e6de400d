package hostcheck

import (
	"bytes"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// maxDepth bounds how deep judge follows jumps (the kernel allows 16).
const maxDepth = 16

// judge walks a forward base chain in rule order, following jumps and
// gotos, and records whether it accepts the slots' traffic each way before
// anything drops or accepts every packet.
type judge struct {
	c      *nftables.Conn
	table  *nftables.Table
	prefix string
	seen   map[string]bool

	out     bool // an accept for packets from the slots' host interfaces
	back    bool // an accept for the replies going to them
	dropAll bool // an unconditional drop was reached
	final   bool // evaluation ended for every packet (unconditional verdict)
}

// walk evaluates chain; it stops at an unconditional accept or drop.
func (j *judge) walk(chain string, depth int) error {
	if depth > maxDepth || j.seen[chain] {
		return nil
	}
	j.seen[chain] = true
	defer delete(j.seen, chain)
	rules, err := j.c.GetRules(j.table, &nftables.Chain{Name: chain, Table: j.table})
	if err != nil {
		return err
	}
	for _, r := range rules {
		m := j.match(r.Exprs)
		v, ok := lastVerdict(r.Exprs)
		if !ok {
			continue
		}
		switch v.Kind {
		case expr.VerdictAccept:
			switch {
			case m.unconditional:
				j.out, j.back, j.final = true, true, true
				return nil
			case m.iifCovers && !m.other:
				j.out = true
			case !m.iif && !m.other && (m.oifCovers || (m.ct && !m.oif)):
				j.back = true
			}
		case expr.VerdictDrop:
			if m.unconditional {
				j.dropAll, j.final = true, true
				return nil
			}
		case expr.VerdictJump, expr.VerdictGoto:
			if err := j.walk(v.Chain, depth+1); err != nil {
				return err
			}
			if j.final {
				return nil
			}
			if v.Kind == expr.VerdictGoto && m.unconditional {
				return nil // a goto never comes back to this chain
			}
		case expr.VerdictReturn:
			if m.unconditional {
				return nil
			}
		}
	}
	return nil
}

// matched is what a rule's match expressions test.
type matched struct {
	unconditional bool // no match at all: the verdict applies to every packet
	iif, oif      bool // matches an input or output interface name
	iifCovers     bool // ...with a wildcard that covers every slot host interface
	oifCovers     bool
	ct            bool // matches a conntrack state (native or xt conntrack/state)
	other         bool // matches anything else (addresses, ports, marks...)
}

func (j *judge) match(es []expr.Any) matched {
	var m matched
	matchedAny := false
	for k := 0; k < len(es); k++ {
		switch e := es[k].(type) {
		case *expr.Counter, *expr.Log, *expr.Verdict:
		case *expr.Meta:
			matchedAny = true
			if (e.Key == expr.MetaKeyIIFNAME || e.Key == expr.MetaKeyOIFNAME) && k+1 < len(es) {
				if c, ok := es[k+1].(*expr.Cmp); ok && c.Register == e.Register && c.Op == expr.CmpOpEq {
					covers := j.covers(c.Data)
					if e.Key == expr.MetaKeyIIFNAME {
						m.iif, m.iifCovers = true, covers
					} else {
						m.oif, m.oifCovers = true, covers
					}
					k++
					continue
				}
			}
			m.other = true
		case *expr.Ct:
			matchedAny = true
			if e.Key != expr.CtKeySTATE {
				m.other = true
				continue
			}
			m.ct = true
			// Skip the bitwise and cmp that test the state bits.
			for k+1 < len(es) {
				if _, ok := es[k+1].(*expr.Bitwise); ok {
					k++
					continue
				}
				if _, ok := es[k+1].(*expr.Cmp); ok {
					k++
				}
				break
			}
		case *expr.Match:
			matchedAny = true
			if e.Name == "conntrack" || e.Name == "state" {
				m.ct = true
			} else {
				m.other = true
			}
		default:
			matchedAny = true
			m.other = true
		}
	}
	m.unconditional = !matchedAny
	return m
}

// covers reports whether an interface-name comparison matches every slot
// host interface: a wildcard (no trailing NUL, as `iifname "pg-h*"` and
// iptables' `-i pg-h+` compile) that is a prefix of the host prefix.
func (j *judge) covers(data []byte) bool {
	if bytes.IndexByte(data, 0) >= 0 || len(data) == 0 {
		return false
	}
	return strings.HasPrefix(j.prefix, string(data))
}

func lastVerdict(es []expr.Any) (*expr.Verdict, bool) {
	if len(es) == 0 {
		return nil, false
	}
	v, ok := es[len(es)-1].(*expr.Verdict)
	return v, ok
}
