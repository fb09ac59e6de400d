package main

// netbench microvm: the cost of microVM slots, each figure beside its
// baseline measured in the same run, interleaved so that the load of a
// shared machine falls on both alike.
//
//   - slot creation (slot.Manager.Create) without and with the guest device
//     (tap, forwarding, guest NAT table);
//   - Acquire through the daemon's Slots service (in process, durable
//     records in a bbolt file, a warm pool) without a policy, with a policy
//     of 1 CIDR and with one of 1,000;
//   - SetEgressPolicy replacing a 1,000-CIDR policy by another.
//
//	cd test && sudo go run ./netbench microvm -n 200 -out /tmp/microvm.md

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases"
)

func microvmMain(args []string) int {
	fs := flag.NewFlagSet("netbench microvm", flag.ExitOnError)
	n := fs.Int("n", 200, "creates of each kind, Acquires of each kind, replacements")
	out := fs.String("out", "", "write the Markdown report here (default: stdout only)")
	_ = fs.Parse(args)
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "netbench: needs root")
		return 2
	}
	md, err := runMicroVM(*n)
	if err != nil {
		fmt.Fprintln(os.Stderr, "netbench:", err)
		return 1
	}
	fmt.Print(md)
	if *out != "" {
		if err := os.WriteFile(*out, []byte(md), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "netbench:", err)
			return 1
		}
	}
	return 0
}

// benchGuest is E2B's guest shape in a range no test or benchmark slot
// network uses.
var benchGuest = slot.Guest{Tap: "tap0", Addr: netip.MustParsePrefix("169.254.255.21/30"), Gateway: netip.MustParseAddr("169.254.255.22")}

// microvmConfig is a slot configuration of the benchmark's own.
func microvmConfig(dir, prefix, cidr string, n int, guest slot.Guest) slot.Config {
	return slot.Config{Prefix: randomPrefix(prefix), NetnsDir: dir, Slots: n, CIDR: netip.MustParsePrefix(cidr), Guest: guest}
}

// cidrs returns n disjoint /32s of 203.0.113.0/24 and beyond (198.18/15).
func cidrs(n, salt int) []string {
	out := make([]string, n)
	for i := range out {
		v := uint32(198)<<24 | uint32(18)<<16 | uint32(i*4+salt)
		out[i] = netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}).String()
	}
	return out
}

type row struct {
	what, baseline string
	base, got      []time.Duration
}

func runMicroVM(n int) (string, error) {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "netbench-microvm")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	plain := microvmConfig(filepath.Join(dir, "a"), "pm", "10.200.0.0/20", n, slot.Guest{})
	guest := microvmConfig(filepath.Join(dir, "b"), "pv", "10.200.16.0/20", 3*n+8, benchGuest)
	var rows []row
	for _, c := range []slot.Config{plain, guest} {
		defer func(c slot.Config) {
			if err := sweep(c); err != nil {
				fmt.Fprintln(os.Stderr, "netbench: sweep:", err)
			}
		}(c)
	}
	mp, err := slot.NewManager(ctx, plain, slot.DefaultOptions())
	if err != nil {
		return "", err
	}
	gopts := slot.DefaultOptions()
	gopts.Egress = egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny}
	mg, err := slot.NewManager(ctx, guest, gopts)
	if err != nil {
		return "", err
	}
	create := row{what: "slot create with the guest device and NAT", baseline: "slot create"}
	for i := 1; i <= n; i++ {
		for _, m := range []*slot.Manager{mp, mg} {
			t0 := time.Now()
			if _, err := m.Create(ctx, i); err != nil {
				return "", err
			}
			d := time.Since(t0)
			if m == mp {
				create.base = append(create.base, d)
			} else {
				create.got = append(create.got, d)
			}
		}
	}
	rows = append(rows, create)
	for _, m := range []*slot.Manager{mp, mg} {
		inv, err := m.Scan(ctx)
		if err != nil {
			return "", err
		}
		if res := m.Teardown(ctx, inv, slot.TeardownOptions{}); res.Err() != nil {
			return "", res.Err()
		}
	}

	acq, err := benchAcquire(ctx, mg, dir, n)
	if err != nil {
		return "", err
	}
	rows = append(rows, acq...)
	_ = mp.Firewall().Delete(ctx)
	_ = mg.Firewall().Delete(ctx)

	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `cd test && sudo go run ./netbench microvm -n %d`, %d of each, interleaved with its baseline (load average %s).\n\n", n, n, loadavg())
	b.WriteString("| measured | p50 | p90 | baseline | p50 | p90 | p50 ratio |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %.2f |\n", r.what, ms(pct(r.got, 0.5)), ms(pct(r.got, 0.9)),
			r.baseline, ms(pct(r.base, 0.5)), ms(pct(r.base, 0.9)), float64(pct(r.got, 0.5))/float64(pct(r.base, 0.5)))
	}
	return b.String(), nil
}

// benchAcquire measures Acquire without a policy, with 1 CIDR and with
// 1,000, interleaved, through the daemon's Slots service over a warm pool
// of guest slots and a durable store; then replacements of the 1,000-CIDR
// policies.
func benchAcquire(ctx context.Context, m *slot.Manager, dir string, n int) ([]row, error) {
	m2 := m
	idx, err := index.New(m2.Config().Slots, nil)
	if err != nil {
		return nil, err
	}
	pl, err := pool.New(m2, idx, pool.Options{Target: 3*n + 4})
	if err != nil {
		return nil, err
	}
	defer func() { _ = pl.Close(context.Background()) }()
	if err := pl.WaitReady(ctx, 3*n+4); err != nil {
		return nil, err
	}
	store, err := leases.Open(filepath.Join(dir, "slots.db"), leases.Options{})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	svc := phases.NewSlotsServer(m2, pl, store, slog.New(slog.NewTextHandler(io.Discard, nil)))
	cctx := control.WithCaller(ctx, control.Caller{Principal: control.Principal{Kind: control.Unix}, Grant: (&control.AccessPolicy{}).Grant(control.Principal{Kind: control.Unix})})
	one := &phasegatev1.EgressPolicy{Allow: []string{"192.0.2.1"}}
	thousand := &phasegatev1.EgressPolicy{Allow: cidrs(1000, 0)}
	other := &phasegatev1.EgressPolicy{Allow: cidrs(1000, 1), Deny: []string{"203.0.113.0/24"}}
	r1 := row{what: "Acquire with a policy of 1 CIDR", baseline: "Acquire without a policy"}
	r1000 := row{what: "Acquire with a policy of 1,000 CIDRs", baseline: "Acquire without a policy"}
	var big []*phasegatev1.AcquireResponse
	for k := range n {
		for j, p := range []*phasegatev1.EgressPolicy{nil, one, thousand} {
			t0 := time.Now()
			resp, err := svc.Acquire(cctx, &phasegatev1.AcquireRequest{Owner: "bench", RequestId: fmt.Sprintf("%d-%d", k, j), EgressPolicy: p})
			if err != nil {
				return nil, err
			}
			d := time.Since(t0)
			switch j {
			case 0:
				r1.base, r1000.base = append(r1.base, d), append(r1000.base, d)
			case 1:
				r1.got = append(r1.got, d)
			case 2:
				r1000.got = append(r1000.got, d)
				big = append(big, resp)
			}
		}
	}
	rep := row{what: "SetEgressPolicy: 1,000 CIDRs replaced by 1,000 others", baseline: "Acquire with a policy of 1,000 CIDRs"}
	rep.base = r1000.got
	for _, resp := range big {
		t0 := time.Now()
		if _, err := svc.SetEgressPolicy(cctx, &phasegatev1.SetEgressPolicyRequest{Index: resp.GetSlot().GetIndex(), LeaseId: resp.GetLeaseId(), EgressPolicy: other}); err != nil {
			return nil, err
		}
		rep.got = append(rep.got, time.Since(t0))
	}
	return []row{r1, r1000, rep}, nil
}
