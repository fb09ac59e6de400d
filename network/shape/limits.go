package shape

import (
	"errors"
	"fmt"
)

// ErrInvalid is a limit the kernel cannot hold or no one means: a burst
// without a rate, a rate outside [MinRate, MaxRate], a burst outside
// [MinBurst, MaxBurst] or longer than MaxBurstTime at its rate.
var ErrInvalid = errors.New("invalid bandwidth limit")

// Limits is a lease's bandwidth: into the slot (ingress) and out of it
// (egress), each a rate in bits per second and a burst in bits. A
// direction whose rate is 0 is not shaped; its burst must be 0 too.
type Limits struct {
	IngressRate, IngressBurst uint64
	EgressRate, EgressBurst   uint64
}

// The bounds of a limit.
const (
	// MinRate is 8 kbit/s (1 kB/s): below it a limit is a typo (a rate in
	// kbit/s given as bit/s), and the kubelet's least is 1 kbit/s.
	MinRate = 8_000
	// MaxRate is 32 Gbit/s: above a veth pair's own throughput
	// (docs/BENCHMARKS.md), so a limit there is none.
	MaxRate = 32_000_000_000
	// MinBurst is 2 KiB in bits: the largest frame must fit, or tbf drops
	// it.
	MinBurst = 2 << 10 * 8
	// MaxBurstTime is how long a burst may take at its rate, in seconds:
	// tbf keeps it in 32-bit ticks of 64 ns (274 s).
	MaxBurstTime = 120
	// MaxBurst is 30 Gbit (3.75 GB): tbf counts its burst and its queue
	// in 32-bit bytes.
	MaxBurst = 30_000_000_000
	// DefaultBurstMin is the least burst a direction without one gets, in
	// bits: 64 KiB, the largest GSO segment TCP hands a veth, which tbf
	// would otherwise cut up in software.
	DefaultBurstMin = 64 << 10 * 8
)

// IsZero reports whether l shapes nothing.
func (l Limits) IsZero() bool { return l == Limits{} }

// DefaultBurst is the burst of a direction at rate given none: what 20 ms
// at the rate carries (what TCP sends in a round trip on a host), and at
// least DefaultBurstMin.
func DefaultBurst(rate uint64) uint64 {
	return max(rate/50, DefaultBurstMin)
}

// WithDefaults is l with each shaped direction's missing burst set to
// DefaultBurst.
func (l Limits) WithDefaults() Limits {
	if l.IngressRate > 0 && l.IngressBurst == 0 {
		l.IngressBurst = DefaultBurst(l.IngressRate)
	}
	if l.EgressRate > 0 && l.EgressBurst == 0 {
		l.EgressBurst = DefaultBurst(l.EgressRate)
	}
	return l
}

// Validate refuses limits the kernel cannot hold (ErrInvalid), naming the
// field: all zero (nothing to shape: clear the limits instead), a burst
// without a rate, a rate or a burst out of bounds. Call it on limits with
// their defaults (WithDefaults).
func (l Limits) Validate() error {
	if l.IsZero() {
		return fmt.Errorf("%w: every rate is 0 (no limit is set by leaving the bandwidth out)", ErrInvalid)
	}
	if err := checkDir("ingress", l.IngressRate, l.IngressBurst); err != nil {
		return err
	}
	return checkDir("egress", l.EgressRate, l.EgressBurst)
}

func checkDir(dir string, rate, burst uint64) error {
	switch {
	case rate == 0 && burst != 0:
		return fmt.Errorf("%w: %s burst %d bits without a rate", ErrInvalid, dir, burst)
	case rate == 0:
		return nil
	case rate < MinRate || rate > MaxRate:
		return fmt.Errorf("%w: %s rate %d bit/s outside [%d, %d]", ErrInvalid, dir, rate, uint64(MinRate), uint64(MaxRate))
	case burst < MinBurst || burst > MaxBurst:
		return fmt.Errorf("%w: %s burst %d bits outside [%d, %d]", ErrInvalid, dir, burst, MinBurst, uint64(MaxBurst))
	case burst/rate >= MaxBurstTime:
		return fmt.Errorf("%w: %s burst %d bits lasts %d s or more at %d bit/s (at most %d s)", ErrInvalid, dir, burst, MaxBurstTime, rate, MaxBurstTime)
	}
	return nil
}

// String is l for a log line and the CLI: "in 40000000/524288 out none".
func (l Limits) String() string {
	dir := func(rate, burst uint64) string {
		if rate == 0 {
			return "none"
		}
		return fmt.Sprintf("%d bit/s burst %d bits", rate, burst)
	}
	return "in " + dir(l.IngressRate, l.IngressBurst) + ", out " + dir(l.EgressRate, l.EgressBurst)
}
