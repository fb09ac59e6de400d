package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
)

// The configuration with its defaults, and ADD's egress policies: the
// network's, and a container's own, passed by the runtime for the
// "egress" capability in runtimeConfig, which the daemon narrows to the
// network's, unless the conflist says "egressCapability": "replace".
func TestLoadConf(t *testing.T) {
	const container = `"capabilities":{"egress":true},"runtimeConfig":{"egress":{"allow":["192.0.2.0/24"],"denyAll":true}}`
	for _, tc := range []struct {
		name, conf         string
		socket             string
		timeout            time.Duration
		network, container string // each egress policy's first allowed prefix; "" for none
		err                string
	}{
		{"defaults", `{"cniVersion":"1.1.0","name":"pgnet","type":"phasegate-cni"}`, defaultSocket, defaultTimeout, "", "", ""},
		{"given", `{"cniVersion":"1.0.0","name":"pgnet","type":"phasegate-cni","socket":"/run/pg/c.sock","timeout":"5s"}`, "/run/pg/c.sock", 5 * time.Second, "", "", ""},
		{"egress", `{"cniVersion":"1.0.0","name":"pgnet","egress":{"allow":["10.0.0.0/8"],"denyAll":true}}`, defaultSocket, defaultTimeout, "10.0.0.0/8", "", ""},
		{"the container's egress", `{"cniVersion":"1.1.0","name":"pgnet","egress":{"allow":["10.0.0.0/8"]},` + container + `}`, defaultSocket, defaultTimeout, "10.0.0.0/8", "192.0.2.0/24", ""},
		{"the container's egress, narrowing by name", `{"cniVersion":"1.1.0","name":"pgnet","egress":{"allow":["10.0.0.0/8"]},"egressCapability":"narrow",` + container + `}`, defaultSocket, defaultTimeout, "10.0.0.0/8", "192.0.2.0/24", ""},
		{"the container's egress replacing the network's", `{"cniVersion":"1.1.0","name":"pgnet","egress":{"allow":["10.0.0.0/8"]},"egressCapability":"replace",` + container + `}`, defaultSocket, defaultTimeout, "192.0.2.0/24", "", ""},
		{"replacing, without the container's", `{"cniVersion":"1.1.0","name":"pgnet","egress":{"allow":["10.0.0.0/8"]},"egressCapability":"replace"}`, defaultSocket, defaultTimeout, "10.0.0.0/8", "", ""},
		{"another capability only", `{"cniVersion":"1.1.0","name":"pgnet","egress":{"allow":["10.0.0.0/8"]},
			"runtimeConfig":{"portMappings":[]}}`, defaultSocket, defaultTimeout, "10.0.0.0/8", "", ""},
		{"misspelt egress", `{"cniVersion":"1.0.0","name":"pgnet","egress":{"alow":["10.0.0.0/8"]}}`, "", 0, "", "", "alow"},
		{"misspelt container's egress", `{"cniVersion":"1.1.0","name":"pgnet","runtimeConfig":{"egress":{"alow":["192.0.2.0/24"]}}}`, "", 0, "", "", "alow"},
		{"unknown egressCapability", `{"cniVersion":"1.1.0","name":"pgnet","egressCapability":"widen"}`, "", 0, "", "", `egressCapability "widen"`},
		{"no name", `{"cniVersion":"1.0.0","type":"phasegate-cni"}`, "", 0, "", "", "no name"},
		{"bad timeout", `{"cniVersion":"1.0.0","name":"pgnet","timeout":"30"}`, "", 0, "", "", `timeout "30"`},
		{"negative timeout", `{"cniVersion":"1.0.0","name":"pgnet","timeout":"-1s"}`, "", 0, "", "", "positive"},
		{"not JSON", `{"name":`, "", 0, "", "", "decode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConf([]byte(tc.conf))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("loadConf: %v, want an error naming %q", err, tc.err)
				}
				return
			}
			if err != nil || c.Socket != tc.socket || c.timeout != tc.timeout {
				t.Fatalf("loadConf: %+v %v, want socket %s timeout %v", c, err, tc.socket, tc.timeout)
			}
			first := func(e *cniv1.Egress) string {
				if e == nil || len(e.Allow) == 0 {
					return ""
				}
				return e.Allow[0]
			}
			network, container := c.egress()
			if first(network) != tc.network || first(container) != tc.container {
				t.Errorf("egress: the network's allows %q first, the container's %q; want %q and %q", first(network), first(container), tc.network, tc.container)
			}
		})
	}
}

var made = cniv1.Attachment{Slot: 3, HostIf: "pg-h3", HostMAC: "e2:97:ef:89:88:12", IfName: "eth0", MAC: "a2:e8:18:ad:eb:3d",
	Netns: "/var/run/netns/c1", Address: "169.254.200.5/31", Gateway: "169.254.200.4"}

// The result lists the host end, the container's end in its sandbox, the
// address on the container's end and the default route; a plugin before
// this one in the conflist keeps what it returned, and the indices point
// at the right interfaces.
func TestResult(t *testing.T) {
	alone, err := loadConf([]byte(`{"cniVersion":"1.1.0","name":"pgnet"}`))
	if err != nil {
		t.Fatal(err)
	}
	chained, err := loadConf([]byte(`{"cniVersion":"1.1.0","name":"pgnet","prevResult":{"cniVersion":"1.1.0",
		"interfaces":[{"name":"lo","sandbox":"/var/run/netns/c1"}],
		"ips":[{"address":"127.0.0.1/8","interface":0}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		conf  *netConf
		first int // index of the host end
	}{{"alone", alone, 0}, {"after another plugin", chained, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := result(tc.conf, made)
			if err != nil {
				t.Fatal(err)
			}
			if len(r.Interfaces) != tc.first+2 || r.Interfaces[tc.first].Name != "pg-h3" || r.Interfaces[tc.first].Sandbox != "" ||
				r.Interfaces[tc.first+1].Name != "eth0" || r.Interfaces[tc.first+1].Sandbox != made.Netns {
				t.Fatalf("interfaces %+v", r.Interfaces)
			}
			ip := r.IPs[len(r.IPs)-1]
			if ip.Address.String() != made.Address || ip.Gateway.String() != made.Gateway || *ip.Interface != tc.first+1 {
				t.Fatalf("ip %+v on interface %d", ip, *ip.Interface)
			}
			if len(r.Routes) != 1 || r.Routes[0].Dst.String() != "0.0.0.0/0" || r.Routes[0].GW.String() != made.Gateway {
				t.Fatalf("routes %+v", r.Routes)
			}
			if _, err := r.GetAsVersion("0.4.0"); err != nil {
				t.Fatalf("as 0.4.0: %v", err)
			}
		})
	}
	bad := made
	bad.Address = "not an address"
	if _, err := result(alone, bad); err == nil {
		t.Fatal("a result of an unreadable address")
	}
}

// CNI_NETNS is opened with the plugin's own credentials; a refusal names
// the variable, not the path, so that two paths refused alike read alike.
func TestOpenNetns(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := openNetns("/proc/self/ns/net")
	if err != nil {
		t.Fatalf("openNetns of this process's namespace: %v", err)
	}
	f.Close()
	for path, code := range map[string]uint{filepath.Join(dir, "missing"): types.ErrUnknownContainer, file: types.ErrInvalidEnvironmentVariables, "/proc/self/ns/mnt": types.ErrInvalidEnvironmentVariables} {
		_, err := openNetns(path)
		var te *types.Error
		if !errors.As(err, &te) || te.Code != code || strings.Contains(te.Error(), path) {
			t.Errorf("openNetns(%s) = %v, want code %d, the path not repeated", path, err, code)
		}
	}
}

// A dual-stack slot's ADD lists both families: each address on the
// container's end with its own gateway, and a default route of each; an
// unreadable IPv6 answer is an error, never half a result.
func TestResultDualStack(t *testing.T) {
	conf, err := loadConf([]byte(`{"cniVersion":"1.1.0","name":"pgnet"}`))
	if err != nil {
		t.Fatal(err)
	}
	dual := made
	dual.Address6, dual.Gateway6 = "fd00:1::5/127", "fd00:1::4"
	r, err := result(conf, dual)
	if err != nil {
		t.Fatal(err)
	}
	var ips, routes []string
	for _, ip := range r.IPs {
		ips = append(ips, fmt.Sprintf("%s via %s on %d", ip.Address.String(), ip.Gateway, *ip.Interface))
	}
	for _, rt := range r.Routes {
		routes = append(routes, rt.Dst.String()+" via "+rt.GW.String())
	}
	wantIPs := []string{made.Address + " via " + made.Gateway + " on 1", "fd00:1::5/127 via fd00:1::4 on 1"}
	wantRoutes := []string{"0.0.0.0/0 via " + made.Gateway, "::/0 via fd00:1::4"}
	if !slices.Equal(ips, wantIPs) || !slices.Equal(routes, wantRoutes) {
		t.Errorf("ips %v, routes %v; want %v, %v", ips, routes, wantIPs, wantRoutes)
	}
	for _, bad := range []struct{ addr, gw string }{{"fd00:1::5", "fd00:1::4"}, {"fd00:1::5/127", "nope"}, {"10.0.0.1/31", "10.0.0.0"}} {
		b := made
		b.Address6, b.Gateway6 = bad.addr, bad.gw
		if _, err := result(conf, b); err == nil {
			t.Errorf("a result of IPv6 address %q and gateway %q", bad.addr, bad.gw)
		}
	}
}
