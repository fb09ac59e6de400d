package control

import (
	"errors"
	"fmt"
	"math"
	"os/user"
	"strconv"
	"strings"
	"unicode"

	"github.com/phasegate/phasegate/internal/names"
)

// AccessPolicy says what each principal may do on the control surface. Root on
// the Unix socket may do everything, without quota or rate limit unless a
// rule that selects it sets a quota; any other principal may do what the
// rules that select it grant, together, and nothing if none does.
//
// As a file (JSON; read strictly, see [LoadPolicy]):
//
//	{
//	  "max_leases": 64,
//	  "max_ports": 64,
//	  "rate": 50,
//	  "principals": [
//	    {"user": "orchestrator", "owners": ["sandbox-*"], "max_leases": 1000, "max_ports": 2000},
//	    {"group": "phasegate-read", "owners": ["*"], "read_only": true},
//	    {"identity": "uri:spiffe://example.org/ns/ci/sa/builder", "owners": ["ci-*"]},
//	    {"identity": "cn:sandbox-scheduler", "owners": ["scheduler"]}
//	  ]
//	}
type AccessPolicy struct {
	// MaxLeases is how many leases one principal may hold at once unless
	// its rule says otherwise; 0 is no limit of its own (the daemon's
	// slots are). Nil, unsaid, is the service's default share of what it
	// leases, [DefaultMaxLeases] of its capacity, which the service sets
	// ([AccessPolicy.WithDefaultMaxLeases]); with none set, no limit.
	MaxLeases *int `json:"max_leases,omitempty"`
	// MaxPorts is how many host ports the leases of one principal may
	// publish at once unless its rule says otherwise; 0 is no limit. Nil,
	// unsaid, is [DefaultMaxPorts].
	MaxPorts *int `json:"max_ports,omitempty"`
	// Rate is how many calls a second one principal may make, in bursts
	// of up to twice as many; 0 is no limit. A policy file without it
	// gets [DefaultRate].
	Rate float64 `json:"rate,omitempty"`
	// Rules are the grants, each to the principals it selects.
	Rules []Rule `json:"principals"`
}

// Rule grants the principals it selects the right to act for Owners:
// exact names, or prefixes written with a trailing "*" ("sandbox-*"; "*"
// alone is every owner), each within the names rule that owners follow
// (printable ASCII but space, '"' and '\'; docs/SECURITY.md, "Names"). A rule selects by exactly one of UID, User, GID,
// Group or Identity.
type Rule struct {
	UID *uint32 `json:"uid,omitempty"`
	// User is a user name, resolved to its uid when the policy is loaded.
	User string `json:"user,omitempty"`
	// GID selects the peers in the group, primary or supplementary.
	GID *uint32 `json:"gid,omitempty"`
	// Group is a group name, resolved to its gid when the policy is loaded.
	Group string `json:"group,omitempty"`
	// Identity selects TLS clients by their certificate's identity (see
	// [Principal]): its kind, then its value, exact or a prefix with a
	// trailing "*": "uri:spiffe://example.org/ns/ci/*" (a URI SAN),
	// "dns:builder.example.org" (a DNS SAN), "cn:sandbox-scheduler" (the
	// common name). A pattern starting "spiffe://" is a URI SAN's; any
	// other pattern without its kind is refused, being ambiguous.
	Identity string `json:"identity,omitempty"`

	Owners []string `json:"owners"`
	// ReadOnly grants Get and List of these owners' leases, nothing more.
	ReadOnly bool `json:"read_only,omitempty"`
	// Attach grants, beside leasing for Owners, attaching a slot to a
	// network namespace the caller passes (a CNI ADD, owner
	// "cni/<network>"), one it could enter itself (docs/SECURITY.md, "The
	// CNI plugin"). The daemon puts a link of its own there, so the right
	// is given apart: root has it, and any other principal only by a rule
	// that says so. A read-only rule cannot.
	Attach bool `json:"attach,omitempty"`
	// MaxLeases overrides the policy's quota for the selected principals.
	MaxLeases *int `json:"max_leases,omitempty"`
	// MaxPorts overrides the policy's quota of published host ports for
	// the selected principals.
	MaxPorts *int `json:"max_ports,omitempty"`
}

// ErrPolicy is wrapped by every error of a policy that cannot be used.
var ErrPolicy = errors.New("control policy")

// DefaultRate is the calls a second one principal may make unless the
// policy says otherwise: far above what an orchestrator's lease traffic
// needs, low enough that one flooding caller leaves the daemon to the
// others.
const DefaultRate = 100

// leaseShare is the part of a service's capacity one principal may hold
// unless the policy says otherwise, as a divisor: a quarter, as one peer
// may hold at most a quarter of a server's connections
// (server.LimitsFor). One tenant at its share leaves root, which has no
// quota, and the others three quarters; it takes four tenants at their
// shares together to leave nothing.
const leaseShare = 4

// DefaultMaxLeases is the quota of leases one principal may hold at once
// when the policy does not say: a quarter of capacity, the leases the
// service can hold at all, and at least one.
func DefaultMaxLeases(capacity int) int { return max(1, capacity/leaseShare) }

// DefaultMaxPorts is how many host ports the leases of one principal
// other than root may publish at once when the policy does not say: one
// for each lease of the default quota at the default 1,024 slots, and
// 0.4% of a protocol's 65,535 ports, so that no tenant takes the host's
// port space (a published port takes its host port from every other
// principal and from the host's own services).
const DefaultMaxPorts = 256

// PortQuota is the policy's quota of published host ports for principals
// no rule sets one for: 0 is none.
func (p *AccessPolicy) PortQuota() int {
	if p.MaxPorts == nil {
		return DefaultMaxPorts
	}
	return *p.MaxPorts
}

// WithDefaultMaxLeases returns a copy of p whose quota, unless p says
// one, is [DefaultMaxLeases] of capacity: what a service that leases
// capacity things at most enforces.
func (p *AccessPolicy) WithDefaultMaxLeases(capacity int) *AccessPolicy {
	c := *p
	if c.MaxLeases == nil {
		q := DefaultMaxLeases(capacity)
		c.MaxLeases = &q
	}
	return &c
}

// Quota is the policy's quota of leases for principals no rule sets one
// for: 0 is none.
func (p *AccessPolicy) Quota() int {
	if p.MaxLeases == nil {
		return 0
	}
	return *p.MaxLeases
}

// ParseRule parses the command-line form of a rule, "SELECTOR=OWNER,…"
// with SELECTOR one of uid:N, user:NAME, gid:N, group:NAME or id:IDENTITY
// (an identity pattern, see [Rule]): "uid:1000=sandbox-*",
// "group:ci=ci-*,build-*", "id:cn:sandbox-scheduler=scheduler".
func ParseRule(s string, readOnly bool) (Rule, error) {
	sel, owners, ok := strings.Cut(s, "=")
	kind, val, ok2 := strings.Cut(sel, ":")
	if !ok || !ok2 || val == "" || owners == "" {
		return Rule{}, fmt.Errorf("%w: \"%s\": want SELECTOR=OWNER,… with SELECTOR uid:N, user:NAME, gid:N, group:NAME or id:KIND:IDENTITY (KIND uri, dns or cn)", ErrPolicy, names.Shown(s))
	}
	r := Rule{Owners: strings.Split(owners, ","), ReadOnly: readOnly}
	num := func() (*uint32, error) {
		n, err := strconv.ParseUint(val, 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %s %q is not a number", ErrPolicy, s, kind, val)
		}
		v := uint32(n)
		return &v, nil
	}
	var err error
	switch kind {
	case "uid":
		r.UID, err = num()
	case "gid":
		r.GID, err = num()
	case "user":
		r.User = val
	case "group":
		r.Group = val
	case "id":
		r.Identity = val
	default:
		err = fmt.Errorf("%w: %q: unknown selector %q (uid, user, gid, group or id)", ErrPolicy, s, kind)
	}
	if err != nil {
		return Rule{}, err
	}
	if err := r.resolve(); err != nil {
		return Rule{}, fmt.Errorf("\"%s\": %w", names.Shown(s), err)
	}
	return r, nil
}

// Resolve turns the rules' user and group names into ids, writes every
// identity pattern with its kind, and checks every field: a policy that
// names an unknown user, an identity pattern without its kind, an owner
// pattern with "*" inside it or outside the names rule, a negative quota or a rate that is not a
// finite number, 0 or more, is refused whole.
func (p *AccessPolicy) Resolve() error {
	var errs []error
	if err := checkQuotas(p.MaxLeases, p.MaxPorts); err != nil {
		errs = append(errs, err)
	}
	if err := checkRate(p.Rate); err != nil {
		errs = append(errs, err)
	}
	for i := range p.Rules {
		if err := p.Rules[i].resolve(); err != nil {
			errs = append(errs, fmt.Errorf("principals[%d]: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

func (r *Rule) resolve() error {
	n := 0
	for _, set := range []bool{r.UID != nil, r.User != "", r.GID != nil, r.Group != "", r.Identity != ""} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("%w: a rule selects by exactly one of uid, user, gid, group or identity (this one by %d)", ErrPolicy, n)
	}
	// A user or a group by name is resolved to its id once, here.
	for _, n := range []struct {
		kind   string
		name   *string
		id     **uint32
		lookup func(string) (string, error)
	}{{"user", &r.User, &r.UID, lookupUID}, {"group", &r.Group, &r.GID, lookupGID}} {
		if *n.name == "" {
			continue
		}
		id, err := resolveName(n.kind, *n.name, n.lookup)
		if err != nil {
			return err
		}
		*n.id, *n.name = id, ""
	}
	if r.Identity != "" {
		kind, pattern, err := parseIdentity(r.Identity)
		if err != nil {
			return err
		}
		if err := checkPattern("identity", pattern); err != nil {
			return err
		}
		if err := checkIdentityChars(pattern); err != nil {
			return err
		}
		r.Identity = kind.word() + ":" + pattern
	}
	if len(r.Owners) == 0 {
		return fmt.Errorf("%w: a rule needs owners (\"*\" for every owner)", ErrPolicy)
	}
	for i, o := range r.Owners {
		if err := checkOwnerPattern(i, o); err != nil {
			return err
		}
	}
	if err := checkQuotas(r.MaxLeases, r.MaxPorts); err != nil {
		return err
	}
	if r.Attach && r.ReadOnly {
		return fmt.Errorf("%w: a read-only rule cannot grant attach", ErrPolicy)
	}
	return nil
}

// checkQuotas refuses a negative max_leases or max_ports.
func checkQuotas(maxLeases, maxPorts *int) error {
	for _, q := range []struct {
		name string
		v    *int
	}{{"max_leases", maxLeases}, {"max_ports", maxPorts}} {
		if q.v != nil && *q.v < 0 {
			return fmt.Errorf("%w: %s %d is negative", ErrPolicy, q.name, *q.v)
		}
	}
	return nil
}

// lookupUID is the uid of the user called name.
func lookupUID(name string) (string, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return "", err
	}
	return u.Uid, nil
}

// lookupGID is the gid of the group called name.
func lookupGID(name string) (string, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return "", err
	}
	return g.Gid, nil
}

// resolveName returns the numeric id of a user or group name, as lookup
// finds it: names are resolved once, when the policy is loaded.
func resolveName(kind, name string, lookup func(string) (string, error)) (*uint32, error) {
	s, err := lookup(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %q: %w", ErrPolicy, kind, name, err)
	}
	id, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("%w: %s %q has id %q, not a number", ErrPolicy, kind, name, s)
	}
	v := uint32(id)
	return &v, nil
}

// checkRate refuses a rate the limiter cannot keep: NaN, an infinity or a
// negative number, negative zero included (a sign that means nothing
// here is a mistake, not a limit of none).
func checkRate(r float64) error {
	if math.IsNaN(r) || math.IsInf(r, 0) || math.Signbit(r) {
		return fmt.Errorf("%w: rate %v: want a finite number of calls a second, 0 or more (0: no limit)", ErrPolicy, r)
	}
	return nil
}

// parseIdentity splits an identity pattern into the kind of certificate
// identity it matches and the pattern of the value.
func parseIdentity(p string) (Kind, string, error) {
	if strings.HasPrefix(p, "spiffe://") {
		return URISAN, p, nil
	}
	word, value, _ := strings.Cut(p, ":")
	for _, k := range []Kind{URISAN, DNSSAN, CommonName} {
		if word == k.word() {
			return k, value, nil
		}
	}
	return 0, "", fmt.Errorf("%w: identity pattern %q does not say which part of a certificate it matches: write uri:%s (a URI SAN), dns:%s (a DNS SAN) or cn:%s (the subject's common name); only a pattern starting spiffe:// may go without, as a URI SAN's",
		ErrPolicy, p, p, p, p)
}

// checkOwnerPattern refuses owner pattern i, p, if it is not a name of
// the names rule (internal/names) with "*" at most at its end: a pattern
// that could look like another owner's is refused with the rest of the
// policy, naming the code point, never written raw.
func checkOwnerPattern(i int, p string) error {
	if p != "" {
		if err := names.Check(fmt.Sprintf("owners[%d]", i), p); err != nil {
			return fmt.Errorf("%w: %w", ErrPolicy, err)
		}
	}
	return checkPattern("owner", p)
}

func checkPattern(what, p string) error {
	if p == "" {
		return fmt.Errorf("%w: empty %s pattern", ErrPolicy, what)
	}
	if i := strings.IndexByte(p, '*'); i >= 0 && i != len(p)-1 {
		return fmt.Errorf("%w: %s pattern %q: \"*\" may only end a pattern (a prefix)", ErrPolicy, what, p)
	}
	return nil
}

// checkIdentityChars refuses an identity pattern with a control
// character (NUL, ESC, DEL, C1): a certificate may carry any UTF-8 in a
// common name, but a pattern that holds them would be read one way in a
// log and match another.
func checkIdentityChars(p string) error {
	for i, r := range p {
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: identity pattern \"%s\": %U, a control character, at byte %d", ErrPolicy, names.Shown(p), r, i)
		}
	}
	return nil
}

// matchPattern reports whether s is p, or starts with p's prefix when p
// ends in "*".
func matchPattern(p, s string) bool {
	if prefix, ok := strings.CutSuffix(p, "*"); ok {
		return strings.HasPrefix(s, prefix)
	}
	return p == s
}

// selects reports whether r applies to principal pr.
func (r *Rule) selects(pr Principal) bool {
	switch {
	case r.UID != nil:
		return pr.Kind == Unix && pr.UID == *r.UID
	case r.GID != nil:
		return pr.inGroup(*r.GID)
	case r.Identity != "":
		// Resolved, the pattern starts with its kind: it selects that
		// kind of identity and no other, whatever the strings.
		word, pattern, _ := strings.Cut(r.Identity, ":")
		return pr.Kind.Certificate() && word == pr.Kind.word() && matchPattern(pattern, pr.Identity)
	}
	return false
}

// Grant is what one principal may do: computed once per call from the
// policy.
type Grant struct {
	lease, read, attach []string // owner patterns
	// MaxLeases is the principal's quota of leases held at once; 0 is none.
	MaxLeases int
	// MaxPorts is the principal's quota of host ports its leases publish
	// at once; 0 is none.
	MaxPorts int
}

// Grant returns what p may do.
func (p *AccessPolicy) Grant(pr Principal) Grant {
	g := Grant{MaxLeases: p.Quota(), MaxPorts: p.PortQuota()}
	if pr.IsRoot() {
		// Root may do everything: no owner it may not lease for, and no
		// quota unless a rule that names it sets one.
		g.lease, g.attach, g.MaxLeases, g.MaxPorts = []string{"*"}, []string{"*"}, 0, 0
	}
	quotaSet, portsSet := false, false
	for i := range p.Rules {
		r := &p.Rules[i]
		if !r.selects(pr) {
			continue
		}
		if r.ReadOnly {
			g.read = append(g.read, r.Owners...)
		} else {
			g.lease = append(g.lease, r.Owners...)
		}
		if r.Attach {
			g.attach = append(g.attach, r.Owners...)
		}
		if r.MaxLeases != nil && !quotaSet {
			g.MaxLeases, quotaSet = *r.MaxLeases, true
		}
		if r.MaxPorts != nil && !portsSet {
			g.MaxPorts, portsSet = *r.MaxPorts, true
		}
	}
	return g
}

// Empty reports whether the grant allows nothing at all.
func (g Grant) Empty() bool { return len(g.lease) == 0 && len(g.read) == 0 }

// MayLease reports whether the principal may acquire, renew and release
// leases for owner.
func (g Grant) MayLease(owner string) bool { return matchAny(g.lease, owner) }

// MayAttach reports whether the principal may attach slots it leases for
// owner to network namespaces it could enter (see [Rule.Attach]).
func (g Grant) MayAttach(owner string) bool { return matchAny(g.attach, owner) }

// MayRead reports whether the principal may see owner's leases.
func (g Grant) MayRead(owner string) bool { return matchAny(g.lease, owner) || matchAny(g.read, owner) }

// ReadOnly reports whether the principal may read but lease for no owner.
func (g Grant) ReadOnly() bool { return len(g.lease) == 0 }

func matchAny(patterns []string, s string) bool {
	for _, p := range patterns {
		if matchPattern(p, s) {
			return true
		}
	}
	return false
}
