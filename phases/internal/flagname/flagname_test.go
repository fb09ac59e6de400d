package flagname_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases/internal/flagname"
)

// What the network layer says of a setting by its Go name the daemon shows
// by its flag, the rest of the message unchanged.
func TestShownNamesTheFlag(t *testing.T) {
	cfg := slot.DefaultConfig()
	cfg.Guest = slot.Guest{Addr: netip.MustParsePrefix("169.254.0.21/30"), Gateway: netip.MustParseAddr("169.254.0.22")}
	guest := cfg.Validate()
	pol, err := egress.Parse(nil, nil, false, true)
	if err != nil {
		t.Fatal(err)
	}
	proxy := egress.Defaults{}.Admit(pol)
	for _, tc := range []struct {
		err          error
		goName, flag string
	}{
		{guest, "Guest.Tap is required with a guest device", "--slot-guest-tap is required with a guest device"},
		{proxy, "the daemon has no egress proxy: ProxyPort is not set", "the daemon has no egress proxy: --slot-egress-proxy-port is not set"},
	} {
		if tc.err == nil || !strings.Contains(tc.err.Error(), tc.goName) {
			t.Fatalf("the network layer said %v, want %q", tc.err, tc.goName)
		}
		if got := flagname.Shown(tc.err); !strings.Contains(got, tc.flag) || strings.Contains(got, tc.goName) {
			t.Errorf("shown as %q, want it saying %q", got, tc.flag)
		}
	}
	if got := flagname.Shown(errors.New("CIDR is fine")); got != "CIDR is fine" {
		t.Errorf("an error without a setting shown as %q", got)
	}
}
