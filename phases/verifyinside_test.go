package phases

import (
	"context"
	"log/slog"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/phasegate/phasegate/network/slot"
)

// A start with a guest device gives every adopted idle slot made without
// one (the last run had no --slot-guest-*) its tap, forwarding and NAT,
// and the settings of a slot (one made by a build that set none has the
// host's); a slot not adopted is left alone.
func TestRepairAdopted(t *testing.T) {
	const adopted = 4
	cfg, plain, _ := newSlotHost(t, adopted+1)
	ctx := context.Background()
	var slots []*slot.Slot
	for i := 1; i <= adopted+1; i++ {
		s, err := plain.Create(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		slots = append(slots, s)
	}
	cfg.Guest = slot.Guest{Tap: "tap0", Addr: netip.MustParsePrefix("10.77.0.21/30"), Gateway: netip.MustParseAddr("10.77.0.22")}
	mgr, err := slot.NewManager(ctx, cfg, slot.DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	// A build that set no settings left the host's: lo's rp_filter off.
	for _, s := range slots {
		if out, err := exec.Command("nsenter", "--net="+s.NetnsPath, "sysctl", "-qw", "net.ipv4.conf.lo.rp_filter=0").CombinedOutput(); err != nil {
			t.Fatalf("rp_filter off in slot %d: %v\n%s", s.Index, err, out)
		}
	}
	d := &Daemon{cfg: Config{Slots: cfg}, log: slog.New(slog.DiscardHandler), mgr: mgr, plan: &restorePlan{adopted: slots[:adopted]}}
	d.repairAdopted()
	for _, s := range slots[:adopted] {
		if fixed, err := mgr.RepairGuest(s); err != nil || len(fixed) > 0 {
			t.Errorf("adopted slot %d after repairAdopted: still lacked %v (%v)", s.Index, fixed, err)
		}
		if fixed, err := mgr.RepairSettings(s); err != nil || len(fixed) > 0 {
			t.Errorf("adopted slot %d after repairAdopted: settings still off: %v (%v)", s.Index, fixed, err)
		}
	}
	// The slot left out was not touched: it still lacks the whole device.
	if fixed, err := mgr.RepairGuest(slots[adopted]); err != nil || len(fixed) == 0 {
		t.Errorf("slot %d, not adopted: lacked %v (%v), want its guest device missing", slots[adopted].Index, fixed, err)
	}
}
