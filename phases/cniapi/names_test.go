package cniapi

import (
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/utils"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/internal/names"
	"github.com/phasegate/phasegate/phases/internal/leasetest"
)

// The CNI door takes exactly the spec's names (libcni's own validators,
// which the plugin runs too), and an ADD on top refuses an interface name
// outside the names rule, since it becomes part of the lease's request id;
// DEL and CHECK still take such a key, attached before the rule.
func TestCNIKeysFollowTheSpecAndTheRule(t *testing.T) {
	for _, s := range []string{
		"abc", "0123456789abcdef", "a.b_c-d", "A", "", "-a", ".a", "_a", "a/b", "a:b", "a b", "a\n", "\na",
		"a\u3164", "\u0430bc", "\uff41", "a\x00", "a\x1b", "a\u200b", "a$", "a*", "cni/x",
	} {
		wantID := utils.ValidateContainerID(s) == nil
		wantNet := utils.ValidateNetworkName(s) == nil
		if got := names.CheckCNIName("name", s) == nil; got != wantID || got != wantNet {
			t.Errorf("names.CheckCNIName(%q) takes it: %v; libcni: container id %v, network name %v", s, got, wantID, wantNet)
		}
	}
	good := cniv1.Key{Network: "pgnet", ContainerID: "abc123", IfName: "eth0"}
	for _, tc := range []struct {
		what       string
		key        cniv1.Key
		add, other bool // whether ADD and DEL/CHECK take it
		codePoint  string
	}{
		{"a spec key", good, true, true, ""},
		{"U+3164 in the interface name", cniv1.Key{Network: "pgnet", ContainerID: "abc123", IfName: "eth0\u3164"}, false, true, "U+3164"},
		{"ESC in the interface name", cniv1.Key{Network: "pgnet", ContainerID: "abc123", IfName: "eth\x1b"}, false, true, "U+001B"},
		{"U+3164 in the container id", cniv1.Key{Network: "pgnet", ContainerID: "abc123\u3164", IfName: "eth0"}, false, false, `"abc123\u3164"`},
		{"a Cyrillic a in the network", cniv1.Key{Network: "pgnet-\u0430", ContainerID: "abc123", IfName: "eth0"}, false, false, `"pgnet-\u0430"`},
	} {
		add, other := checkNewKey(tc.key), checkKey(tc.key)
		if (add == nil) != tc.add || (other == nil) != tc.other {
			t.Errorf("%s: ADD %v, DEL and CHECK %v; want taken %v and %v", tc.what, add, other, tc.add, tc.other)
		}
		if add != nil && (!strings.Contains(add.Error(), tc.codePoint) || !leasetest.Printable(add.Error())) {
			t.Errorf("%s: ADD refused with %q, want it to name %s in printable ASCII", tc.what, add, tc.codePoint)
		}
		if add != nil && status.Code(add) != codes.InvalidArgument {
			t.Errorf("%s: ADD refused with %v, want InvalidArgument", tc.what, status.Code(add))
		}
	}
}
