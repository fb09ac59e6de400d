package leases

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"math"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/phasegate/phasegate/network/account"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases/internal/recordpb"
	"github.com/phasegate/phasegate/network/netns"
	"github.com/phasegate/phasegate/network/ports"
	"github.com/phasegate/phasegate/network/shape"
)

// State is what a recorded slot is doing. The zero State is invalid, so a
// record whose State was never set is refused rather than stored.
type State uint8

const (
	// Idle: the slot is made and warm in the pool, without an owner. At a
	// restart an intact idle slot is adopted into the pool.
	Idle State = 1
	// Leased: the slot is handed to Owner under LeaseID. At a restart an
	// intact leased slot is kept for its owner, untouched.
	Leased State = 2
	// Held: the slot was found with something living in it that no record
	// vouched for (the records were lost, or a lease's slot was not the
	// one recorded): it is kept as it is and quarantined, start after
	// start, until an operator adopts it back as a lease (a Put of a
	// Leased record) or releases it (a Delete, once it is torn down).
	Held State = 3
)

// states is the one table of a record's states: the name each is shown
// by, and its value in the stored message.
var states = map[State]struct {
	name   string
	stored recordpb.State
}{
	Idle:   {"idle", recordpb.State_STATE_IDLE},
	Leased: {"leased", recordpb.State_STATE_LEASED},
	Held:   {"held", recordpb.State_STATE_HELD},
}

// String returns the state's name.
func (s State) String() string {
	if st, ok := states[s]; ok {
		return st.name
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// stateOf is the state a stored message's value stands for.
func stateOf(v recordpb.State) (State, bool) {
	for s, st := range states {
		if st.stored == v {
			return s, true
		}
	}
	return 0, false
}

// MaxIDLen bounds Owner, LeaseID, RequestID and Principal (bytes), so
// that the request index's keys stay far below bbolt's key size limit. A
// principal read with [LegacyCertificate] before it may exceed it by that
// prefix.
const MaxIDLen = 1024

// Record is the durable record of one slot. The store keeps at most one
// per Index.
type Record struct {
	// Index is the slot's index, at least 1.
	Index int
	// State is Idle or Leased.
	State State

	// Owner, LeaseID and RequestID are set only when Leased (Owner and
	// LeaseID non-empty); Owner and RequestID may be set when Held, as
	// hints of the lease the slot may carry (no lease, and not in the
	// request index). RequestID is the client's id for the Acquire
	// that took the slot; empty means the client sent none, and the record
	// is then not in the request index (ByRequest cannot find it).
	Owner, LeaseID, RequestID string
	// Principal is who took the lease, as the control surface identified
	// it ("uid:1000", "x509:uri:spiffe://…"): only it, or a principal the
	// policy lets act for Owner, may renew or release the lease, and only
	// it gets the lease back from a retried Acquire. Set only when Leased.
	// A certificate's principal recorded before schema 5 reads as
	// [LegacyCertificate] "x509:<identity>".
	Principal string
	// Acquired is when the lease was granted; zero when Idle.
	Acquired time.Time
	// TTL is the lease's time to live. Zero means held until released
	// (Expires is then zero too); it is zero when Idle.
	TTL time.Duration
	// Expires is when the lease lapses unless kept alive: KeepAlive sets it
	// to now+TTL. Zero exactly when TTL is zero.
	Expires time.Time

	// Netns is the kernel identity (device, inode) of the slot's netns file
	// and HostIfindex the interface index of its host-side veth, as they
	// were when the slot was made. A namespace or link recreated under the
	// same name has another identity, so it is never taken for this slot.
	// Zero values never match a live object.
	Netns       netns.ID
	HostIfindex int
	// Created is when the slot's kernel objects were made.
	Created time.Time

	// Egress is the lease's egress policy, nil for none. Set only when
	// Leased.
	Egress *egress.Policy

	// Ports are the lease's published ports (package network/ports), none
	// for none. Set only when Leased.
	Ports []ports.Mapping
	// Bandwidth is the lease's bandwidth limits with their defaults, nil
	// for none. Set only when Leased.
	Bandwidth *shape.Limits

	// Attachment is set on a lease whose slot has its inside end in a
	// network namespace the daemon does not own (a CNI ADD); nil for a
	// lease of the slot as it was made. Set only when Leased.
	Attachment *Attachment

	// HeldSince and HeldReason say since when and why a Held slot is
	// kept; set exactly when Held.
	HeldSince  time.Time
	HeldReason string

	// Ledger is what the lease's earlier host links and egress policies
	// counted: its totals are the ledger plus what its current ones count
	// (package network/account). Zero until a link is made again or a
	// policy written again; set only when Leased.
	Ledger account.Ledger
}

// Attachment is where an attached slot's inside end lives: the runtime's
// namespace, by kernel identity and by the path the runtime gave, and the
// end's name there.
type Attachment struct {
	Netns     netns.ID
	NetnsPath string
	IfName    string
}

// MaxAttachmentPath bounds a recorded attachment's namespace path: a
// path the kernel takes (PATH_MAX).
const MaxAttachmentPath = 4096

// Expired reports whether a lease with a TTL has lapsed at now. A record
// with a zero Expires (Idle, or TTL 0) never expires.
func (r Record) Expired(now time.Time) bool {
	return !r.Expires.IsZero() && !now.Before(r.Expires)
}

// validate checks what no writer may store. It never looks at the store.
func (r *Record) validate() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: slot %d: %s", ErrInvalid, r.Index, fmt.Sprintf(format, a...))
	}
	if err := checkIndex(r.Index); err != nil {
		return err
	}
	if len(r.Owner) > MaxIDLen || len(r.LeaseID) > MaxIDLen || len(r.RequestID) > MaxIDLen || len(r.Principal) > MaxIDLen+len(LegacyCertificate) ||
		len(r.HeldReason) > MaxIDLen {
		return bad("owner, lease id, request id, principal and held reason are limited to %d bytes", MaxIDLen)
	}
	if (r.State == Held) != !r.HeldSince.IsZero() || (r.State != Held && r.HeldReason != "") {
		return bad("a held record, and only one, says since when and why it is held")
	}
	if r.State != Leased && r.Ledger != (account.Ledger{}) {
		return bad("only a lease carries a ledger")
	}
	if r.HostIfindex < 0 || r.HostIfindex > math.MaxInt32 {
		return bad("host ifindex %d out of range", r.HostIfindex)
	}
	if r.TTL < 0 {
		return bad("negative TTL %v", r.TTL)
	}
	if e := r.Egress; e != nil {
		if err := e.Validate(); err != nil {
			return bad("%v", err)
		}
	}
	if err := ports.ValidateList(r.Ports); err != nil {
		return bad("%v", err)
	}
	if r.State != Leased && len(r.Ports) > 0 {
		return bad("only a lease publishes ports")
	}
	if b := r.Bandwidth; b != nil {
		if err := b.Validate(); err != nil {
			return bad("%v", err)
		}
		if r.State != Leased {
			return bad("only a lease has bandwidth limits")
		}
	}
	if a := r.Attachment; a != nil && (a.IfName == "" || len(a.IfName) > 15 || len(a.NetnsPath) > MaxAttachmentPath) {
		return bad("an attachment names its interface (1 to 15 bytes) and a namespace path of at most %d bytes", MaxAttachmentPath)
	}
	switch r.State {
	case Idle:
		if r.Owner != "" || r.LeaseID != "" || r.RequestID != "" || r.Principal != "" || !r.Acquired.IsZero() || r.TTL != 0 || !r.Expires.IsZero() || r.Egress != nil || r.Attachment != nil {
			return bad("an idle record has no owner, lease, request, principal, acquisition time, TTL, expiry, egress policy or attachment")
		}
	case Leased:
		if r.Owner == "" || r.LeaseID == "" || r.Principal == "" {
			return bad("a leased record needs an owner, a lease id and a principal")
		}
		if r.Acquired.IsZero() {
			return bad("a leased record needs its acquisition time")
		}
		if (r.TTL == 0) != r.Expires.IsZero() {
			return bad("expiry must be set exactly when the TTL is not zero (TTL %v, expires %v)", r.TTL, r.Expires)
		}
	case Held:
		if r.LeaseID != "" || r.Principal != "" || !r.Acquired.IsZero() || r.TTL != 0 || !r.Expires.IsZero() || r.Egress != nil || r.Attachment != nil {
			return bad("a held record has no lease, principal, acquisition time, TTL, expiry, egress policy or attachment")
		}
	default:
		return bad("state %v is neither idle, leased nor held", r.State)
	}
	return nil
}

// checkIndex refuses an index that cannot be a slot's: slots count from 1,
// and keys hold 32 bits.
func checkIndex(i int) error {
	if i < 1 || uint64(i) > math.MaxUint32 {
		return fmt.Errorf("%w: index %d outside [1, %d]", ErrInvalid, i, uint32(math.MaxUint32))
	}
	return nil
}

// NewLeaseID returns a fresh lease id: 128 random bits from crypto/rand, as
// 32 lowercase hex digits. crypto/rand cannot fail on Linux (Go ends the
// program rather than return short), so there is no error.
func NewLeaseID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Keys. A slot's key is its index as 4 big-endian bytes, so a cursor walks
// the slots in index order. A request key is the owner's length (2 bytes,
// big-endian), the owner, then the request id: unambiguous whatever bytes
// the two hold.

func slotKey(i int) []byte {
	return binary.BigEndian.AppendUint32(make([]byte, 0, 4), uint32(i))
}

func parseSlotKey(k []byte) (int, error) {
	if len(k) != 4 {
		return 0, fmt.Errorf("slot key %x is not 4 bytes", k)
	}
	i := int(binary.BigEndian.Uint32(k))
	if i == 0 {
		return 0, fmt.Errorf("slot key %x is index 0", k)
	}
	return i, nil
}

func requestKey(owner, requestID string) []byte {
	k := make([]byte, 0, 2+len(owner)+len(requestID))
	k = binary.BigEndian.AppendUint16(k, uint16(len(owner)))
	return append(append(k, owner...), requestID...)
}

// requestKeyOf is nil for a record that is not in the request index.
func requestKeyOf(r *Record) []byte {
	if r.State != Leased || r.RequestID == "" {
		return nil
	}
	return requestKey(r.Owner, r.RequestID)
}

// Encoding: the protobuf message of record.proto. Protobuf over JSON
// because it decodes several times faster (Load at every start), and
// because a message read and written back keeps the fields its reader does
// not know, so an older binary's Update does not strip what a newer one
// recorded.

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromUnixNano(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// fill copies r into m, leaving m's unknown fields as they are.
func fill(m *recordpb.Record, r *Record) {
	m.State = states[r.State].stored
	m.Owner, m.LeaseId, m.RequestId, m.Principal = r.Owner, r.LeaseID, r.RequestID, r.Principal
	m.PrincipalKinds = r.State == Leased
	m.AcquiredUnixNano = unixNano(r.Acquired)
	m.TtlNanos = int64(r.TTL)
	m.ExpiresUnixNano = unixNano(r.Expires)
	m.NetnsDev, m.NetnsIno = r.Netns.Dev, r.Netns.Ino
	m.HostIfindex = int32(r.HostIfindex)
	m.CreatedUnixNano = unixNano(r.Created)
	m.EgressPolicy = egress.ToMessage[recordpb.EgressPolicy](r.Egress)
	m.Bandwidth = nil
	if b := r.Bandwidth; b != nil {
		m.Bandwidth = &recordpb.Bandwidth{IngressRate: b.IngressRate, IngressBurst: b.IngressBurst, EgressRate: b.EgressRate, EgressBurst: b.EgressBurst}
	}
	m.Attachment = nil
	if a := r.Attachment; a != nil {
		m.Attachment = &recordpb.Attachment{NetnsDev: a.Netns.Dev, NetnsIno: a.Netns.Ino, NetnsPath: a.NetnsPath, IfName: a.IfName}
	}
	m.HeldUnixNano, m.HeldReason = unixNano(r.HeldSince), r.HeldReason
	m.Ports = portsMessage(r.Ports)
	m.Carried, m.Start = usageMessage(r.Ledger.Carried), usageMessage(account.Usage{Counts: r.Ledger.Start})
}

// usageMessage is u as the record stores it; nil for none.
func usageMessage(u account.Usage) *recordpb.Usage {
	if u == (account.Usage{}) {
		return nil
	}
	return &recordpb.Usage{BytesIn: u.BytesIn, PacketsIn: u.PacketsIn, BytesOut: u.BytesOut, PacketsOut: u.PacketsOut, Dropped: u.Dropped}
}

// usageOf is the usage m stores (zero for nil).
func usageOf(m *recordpb.Usage) account.Usage {
	return account.Usage{Counts: account.Counts{BytesIn: m.GetBytesIn(), PacketsIn: m.GetPacketsIn(), BytesOut: m.GetBytesOut(),
		PacketsOut: m.GetPacketsOut()}, Dropped: m.GetDropped()}
}

func encode(r *Record) ([]byte, error) {
	var m recordpb.Record
	fill(&m, r)
	return marshal(&m)
}

func marshal(m *recordpb.Record) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// decode parses the value stored under index i. The message is returned
// too, for a caller that writes it back with its unknown fields.
func decode(i int, v []byte) (Record, *recordpb.Record, error) {
	var m recordpb.Record
	if err := proto.Unmarshal(v, &m); err != nil {
		return Record{}, nil, err
	}
	r, err := fromMessage(i, &m)
	return r, &m, err
}

// fromMessage converts and checks a decoded message.
func fromMessage(i int, m *recordpb.Record) (Record, error) {
	r := Record{
		Index:       i,
		Owner:       m.Owner,
		LeaseID:     m.LeaseId,
		RequestID:   m.RequestId,
		Principal:   legacyCertificate(m),
		Acquired:    fromUnixNano(m.AcquiredUnixNano),
		TTL:         time.Duration(m.TtlNanos),
		Expires:     fromUnixNano(m.ExpiresUnixNano),
		Netns:       netns.ID{Dev: m.NetnsDev, Ino: m.NetnsIno},
		HostIfindex: int(m.HostIfindex),
		Created:     fromUnixNano(m.CreatedUnixNano),
		HeldSince:   fromUnixNano(m.HeldUnixNano),
		HeldReason:  m.HeldReason,
	}
	r.Ledger = account.Ledger{Carried: usageOf(m.GetCarried()), Start: usageOf(m.GetStart()).Counts}
	// A record is data: its policy is checked as a client's is.
	pol, err := egress.FromMessage(m.GetEgressPolicy())
	if err != nil {
		return Record{}, fmt.Errorf("%w: slot %d: %w", ErrInvalid, i, err)
	}
	r.Egress = pol
	if r.Ports, err = ports.FromMessages(m.GetPorts()); err != nil {
		return Record{}, fmt.Errorf("%w: slot %d: %w", ErrInvalid, i, err)
	}
	if b := m.GetBandwidth(); b != nil {
		r.Bandwidth = &shape.Limits{IngressRate: b.GetIngressRate(), IngressBurst: b.GetIngressBurst(), EgressRate: b.GetEgressRate(), EgressBurst: b.GetEgressBurst()}
	}
	if a := m.GetAttachment(); a != nil {
		r.Attachment = &Attachment{Netns: netns.ID{Dev: a.GetNetnsDev(), Ino: a.GetNetnsIno()}, NetnsPath: a.GetNetnsPath(),
			IfName: a.GetIfName()}
	}
	var ok bool
	if r.State, ok = stateOf(m.State); !ok {
		return Record{}, fmt.Errorf("unknown state %d", m.State)
	}
	if err := r.validate(); err != nil {
		return Record{}, err
	}
	return r, nil
}
