package slot

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/network"
)

func TestValidate6(t *testing.T) {
	good := Config{Prefix: "pg-", NetnsDir: "/run/netns", Slots: 1000, CIDR: DefaultCIDR}
	cases := []struct {
		cidr6 string
		want  string // "" valid
	}{
		{"fd00:1::/64", ""},
		{"fd00:1::/118", "holds 512 /127s"},
		{"fd00:1::/117", ""},
		{"10.0.0.0/8", "not an IPv6 network"},
		{"::ffff:10.0.0.0/104", "not an IPv6 network"},
		{"fd00:1::1/64", "host bits"},
		{"fd00:1::/128", "too small for one /127"},
		{"fd00:1::/127", "holds one /127"},
	}
	for _, tc := range cases {
		c := good
		c.CIDR6 = netip.MustParsePrefix(tc.cidr6)
		err := c.Validate()
		var se *network.SettingError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: Validate() = %v", tc.cidr6, err)
		case tc.want != "" && (!errors.Is(err, ErrInvalidConfig) || !errors.As(err, &se) || se.Setting != "CIDR6" || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: Validate() = %v, want a CIDR6 SettingError mentioning %q", tc.cidr6, err, tc.want)
		}
	}
}

func TestAddrs6(t *testing.T) {
	c := Config{CIDR6: netip.MustParsePrefix("fd00:1:0:0:ffff:ffff:ffff:fff0/124")}
	for _, tc := range []struct {
		i            int
		host, inside string
	}{
		{1, "fd00:1::ffff:ffff:ffff:fff0/127", "fd00:1::ffff:ffff:ffff:fff1/127"},
		{8, "fd00:1::ffff:ffff:ffff:fffe/127", "fd00:1::ffff:ffff:ffff:ffff/127"},
		{9, "fd00:1:0:1::/127", "fd00:1:0:1::1/127"}, // the carry into the upper half
	} {
		h, in := c.Addrs6(tc.i)
		if h.String() != tc.host || in.String() != tc.inside {
			t.Errorf("Addrs6(%d) = %s, %s; want %s, %s", tc.i, h, in, tc.host, tc.inside)
		}
	}
	if h, in := (Config{}).Addrs6(1); h.IsValid() || in.IsValid() {
		t.Errorf("Addrs6 without CIDR6 = %s, %s", h, in)
	}
}
