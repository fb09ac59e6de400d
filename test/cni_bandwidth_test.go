package test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// The "bandwidth" capability through cnitool (the daemon in a node's
// namespace of its own), as the kubelet passes a
// pod's kubernetes.io/ingress-bandwidth and egress-bandwidth: the ADD
// sets the limits on the attachment's host end (a tbf, and the slot's ifb
// behind a redirect), Get shows them with their default burst, the DEL
// leaves no ifb. Limits no one means, or JSON that is no limits, are
// refused with the spec's code 7 and attach nothing.
func TestCNIBandwidthCapability(t *testing.T) {
	nd := newNode(t)
	h, d, _ := slotsInNode(t, nd, nil, nil, nil)
	c := d.slots()
	n := newCNINet(t, h.prefix+"bw", d.control, map[string]any{"capabilities": map[string]any{"bandwidth": true}})
	ctr := containerNetns(t, "bw")
	capArgs := `CAP_ARGS={"bandwidth":{"ingressRate":40000000,"egressRate":20000000,"egressBurst":1048576}}`
	n.mustTool("add", ctr, capArgs)
	l := attachmentIn(t, c, n.name, ctr)
	want := &phasegatev1.Bandwidth{IngressRate: 40e6, IngressBurst: 800_000, EgressRate: 20e6, EgressBurst: 1 << 20}
	if got := l.GetBandwidth(); got.String() != want.String() {
		t.Errorf("the attachment's limits: %v, want %v", got, want)
	}
	ifb := strings.Replace(l.GetHostInterface(), h.prefix+"h", h.prefix+"b", 1)
	for _, dev := range []string{l.GetHostInterface(), ifb} {
		out, err := exec.Command("nsenter", "--net="+nd.ns, "--", "tc", "qdisc", "show", "dev", dev, "root").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "tbf") {
			t.Errorf("%s's root: %v: %s", dev, err, out)
		}
	}
	n.mustTool("del", ctr, capArgs)
	// A rate alone, as Kubernetes' runtimes pass it: their burst for
	// "none" takes the default.
	kubelet := `CAP_ARGS={"bandwidth":{"ingressRate":10000000,"ingressBurst":4294967295}}`
	n.mustTool("add", ctr, kubelet)
	if got := attachmentIn(t, c, n.name, ctr).GetBandwidth(); got.GetIngressRate() != 10e6 || got.GetIngressBurst() != 64<<10*8 {
		t.Errorf("a runtime's burst for none: %v, want the default", got)
	}
	n.mustTool("del", ctr, kubelet)
	// The DEL answers before its slot's teardown, which deletes the ifb.
	if !poll(10*time.Second, func() bool {
		return exec.Command("nsenter", "--net="+nd.ns, "--", "ip", "link", "show", ifb).Run() != nil
	}) {
		t.Errorf("10 s after the DEL, %s is there", ifb)
	}
	other := containerNetns(t, "bwbad")
	for _, bad := range []string{
		`{"ingressRate":-1}`,
		`{"ingressRate":1.5}`,
		`{"ingresRate":40000000}`,
		`{"egressRate":100}`,
		`{"ingressRate":40000000,"ingressBurst":8}`,
		`{"egressBurst":1048576}`,
		`{"ingressRate":18446744073709551615}`,
	} {
		conf := n.confWith(map[string]any{"runtimeConfig": map[string]any{"bandwidth": json.RawMessage(bad)}})
		_, perr := n.exec("ADD", conf, "CNI_CONTAINERID=bwbad", "CNI_IFNAME=eth0", "CNI_NETNS="+other)
		if perr == nil || perr.Code != 7 {
			t.Errorf("ADD with bandwidth %s: %+v, want code 7", bad, perr)
		}
		if ls := cniLeasesOf(t, c, n.name); len(ls) != 0 {
			t.Errorf("after the refused ADD with %s: %d attachments", bad, len(ls))
		}
	}
}
