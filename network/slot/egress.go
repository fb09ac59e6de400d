package slot

import (
	"context"
	"errors"
	"fmt"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/inside"
)

// EgressDefaults returns the daemon's part of every egress policy, as the
// manager writes it (Options.Egress).
func (m *Manager) EgressDefaults() egress.Defaults { return m.fw.EgressDefaults() }

// ApplyEgress writes lease policy p for slot s, each side in one
// transaction: on the host, in the slot table's chain for s, where no
// tenant can reach it and which is what holds the slot to p; and in the
// slot's own egress table (package inside), which drops the same packets
// before they leave the slot and counts them there. The two sides are
// written at once: they are transactions of two namespaces, each under its
// own lock in the kernel. A slot table inside that refuses the write (its
// root changed the table) is replaced whole. A slot whose namespace is no
// longer the one it was made with gives an error wrapping ErrGone. When
// one side fails, the other may hold p: the caller writes its last policy
// back.
//
// The caller holds s for the call: nothing else may release it meanwhile,
// or the host's chain could outlive the slot (a new slot at the index
// clears it when it is made: Create).
func (m *Manager) ApplyEgress(ctx context.Context, s *Slot, p egress.Policy) error {
	d := m.EgressDefaults()
	insideDone := make(chan error, 1)
	go func() {
		insideDone <- withInside(s, func(is inside.Slot) error {
			if err := inside.ApplyPolicy(is, p, d); err == nil || errors.Is(err, egress.ErrInvalid) {
				return err
			}
			if err := inside.ClearPolicy(is); err != nil {
				return err
			}
			return inside.ApplyPolicy(is, p, d)
		})
	}()
	var errs []error
	if err := m.fw.SetEgress(ctx, s.HostIf, p); err != nil {
		errs = append(errs, err)
	}
	if err := <-insideDone; err != nil {
		errs = append(errs, fmt.Errorf("egress policy inside: %w", err))
	}
	if len(errs) > 0 {
		return fmt.Errorf("slot %d: %w", s.Index, errors.Join(errs...))
	}
	return nil
}

// ClearEgress removes slot s's egress policy, on the host and inside.
func (m *Manager) ClearEgress(ctx context.Context, s *Slot) error {
	if err := m.fw.ClearEgress(ctx, s.HostIf); err != nil {
		return fmt.Errorf("slot %d: %w", s.Index, err)
	}
	if err := withInside(s, inside.ClearPolicy); err != nil {
		return fmt.Errorf("slot %d: egress policy inside: %w", s.Index, err)
	}
	return nil
}

// EgressState is what holds slot s's egress policy.
type EgressState struct {
	// Host and Inside are the fingerprints (egress.Policy.Fingerprint) of
	// the policy in the slot table's chain and in the slot's own table;
	// "" where there is none.
	Host, Inside string
	// Drops counts what the policy dropped, on both sides: a packet
	// dropped inside never reaches the host.
	Drops uint64
}

// InspectEgress reads slot s's egress policy on both sides.
func (m *Manager) InspectEgress(ctx context.Context, s *Slot) (EgressState, error) {
	host, err := m.fw.EgressOf(ctx, s.HostIf)
	if err != nil {
		return EgressState{}, fmt.Errorf("slot %d: %w", s.Index, err)
	}
	f, err := m.InspectInside(s)
	if err != nil {
		return EgressState{}, err
	}
	return EgressState{Host: host.Fingerprint, Inside: f.Fingerprint, Drops: host.Drops + f.Drops}, nil
}

// EgressDrops returns the packets slot s's egress policy dropped, on the
// host and inside: what InspectEgress counts, without reading the rest.
// The two sides are read at once, as ApplyEgress writes them.
func (m *Manager) EgressDrops(ctx context.Context, s *Slot) (uint64, error) {
	var in uint64
	insideDone := make(chan error, 1)
	go func() {
		insideDone <- withInside(s, func(is inside.Slot) (err error) {
			in, err = inside.Drops(is)
			return err
		})
	}()
	host, err := m.fw.EgressOf(ctx, s.HostIf)
	if ierr := <-insideDone; err == nil {
		err = ierr
	}
	if err != nil {
		return 0, fmt.Errorf("slot %d: %w", s.Index, err)
	}
	return host.Drops + in, nil
}

// InspectInside reads slot s's own tables: the guest's (NAT, the tap's
// filter) and the egress policy's fingerprint and drops.
func (m *Manager) InspectInside(s *Slot) (inside.Found, error) {
	var f inside.Found
	err := withInside(s, func(is inside.Slot) (err error) {
		f, err = inside.Inspect(is, m.cfg.Guest.insideGuest())
		return err
	})
	if err != nil {
		return inside.Found{}, fmt.Errorf("slot %d: %w", s.Index, err)
	}
	return f, nil
}
