package phases

import (
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/lease"
	"github.com/phasegate/phasegate/phases/slotsapi"
)

// The daemon's side of its leases: what the lease core asks of the
// daemon (its impairment, the egress defaults of its configuration) and
// the Slots service the benchmark serves.

// LeaseStore is what the lease core needs of the durable records
// ([lease.Store]); the benchmark's in-memory baseline (test/bench)
// implements it.
type LeaseStore = lease.Store

// NewSlotsServer returns the daemon's Slots API over pl, which owns the
// slot indices and makes its slots with m, and store, with no lease
// restored, no expiry loop, no tracing and no metrics; the egress
// policies' defaults are m's. Its calls must come through a
// [control.Guard] (the service authorizes the caller the guard names, and
// refuses a call without one). The daemon builds its own; this exists so
// that the benchmark's in-memory baseline serves the same code. A nil log
// discards the service's lines.
func NewSlotsServer(m *slot.Manager, pl *pool.Pool, store LeaseStore, log *slog.Logger) phasegatev1.SlotsServer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return slotsapi.New(lease.New(m, pl, lease.Options{Records: lease.NewRecords(store, log), Log: log}))
}

// impairedFor is the daemon's Impairment: that of the surface the
// principal calls on.
func (d *Daemon) impairedFor(principal string) (time.Time, bool) {
	srv := d.ctl.srv
	// A certificate's lease, recorded with its kind or, by an older build,
	// without it (leases.LegacyCertificate), was taken over the port.
	if control.KindOf(principal).Certificate() || strings.HasPrefix(principal, leases.LegacyCertificate) {
		srv = d.app.Server()
	}
	st := srv.ConnStats()
	return st.Impaired, st.ImpairedNow
}

// egressDefaults resolves the daemon's part of every egress policy: the
// configured sets, with the slot CIDR (every slot's gateway and every
// other slot) and the host's own addresses added to the always-denied.
// The host check reads those addresses (read is true) unless it did not
// run (an upgrade's new image): then they are read here.
func egressDefaults(cfg Config, host []netip.Prefix, read bool) (egress.Defaults, error) {
	d := cfg.Egress
	if !read {
		var err error
		if host, err = cfg.Slots.HostAddrs(); err != nil {
			return egress.Defaults{}, err
		}
	}
	d.AlwaysAllow = slices.Clone(d.AlwaysAllow)
	d.AlwaysDeny = append(append(slices.Clone(d.AlwaysDeny), cfg.Slots.CIDR), host...)
	if d.IPv6 = cfg.Slots.CIDR6.IsValid(); d.IPv6 {
		d.AlwaysDeny = append(d.AlwaysDeny, cfg.Slots.CIDR6) // as the IPv4 CIDR: denied whole
	}
	return d, nil
}

// warningsLine names the lifecycle's warnings in one line, "" for none: what
// /health says when it says warn.
func warningsLine(s lifecycle.Snapshot) string {
	var out []string
	for _, w := range s.Warnings {
		out = append(out, w.Name+": "+w.Message)
	}
	return strings.Join(out, "; ")
}
