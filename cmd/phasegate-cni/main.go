package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"golang.org/x/sys/unix"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
	"github.com/phasegate/phasegate/network/netns"
)

const (
	// maxStdin bounds the configuration read on stdin: the daemon's own
	// bound on a request (1 MiB), which an egress policy of thousands of
	// ranges fits in. A CNI configuration is kilobytes; one larger would
	// be refused by the daemon anyway, after the plugin had read it whole.
	maxStdin = 1 << 20
	// defaultSocket is the daemon's control socket on its defaults.
	defaultSocket = "/run/phasegate/control.sock"
	// defaultTimeout bounds a call, the wait for a daemon that is down or
	// starting included: below the runtimes' own limits on a CNI call.
	defaultTimeout = 30 * time.Second
	// retryInterval spaces the calls to a daemon that is not available.
	retryInterval = 100 * time.Millisecond
)

// netConf is the plugin's configuration: the spec's fields and its own.
type netConf struct {
	types.PluginConf
	Socket  string        `json:"socket,omitempty"`
	Timeout string        `json:"timeout,omitempty"`
	Egress  *cniv1.Egress `json:"egress,omitempty"`
	// EgressCapability says what a container's own policy (the
	// "egress" capability's args) does to the network's: "narrow" (the
	// default: the attachment lets out only what both let out) or
	// "replace" (the container's is taken whole, the network's
	// ignored).
	EgressCapability string `json:"egressCapability,omitempty"`
	// RuntimeConfig holds the capability args the runtime passes for
	// the capabilities the conflist declares: "egress", a container's
	// own policy; "portMappings", its published ports; "bandwidth", its
	// limits (CNI's capability, which the kubelet fills from the pod's
	// annotations).
	RuntimeConfig struct {
		Egress       *cniv1.Egress       `json:"egress,omitempty"`
		PortMappings []cniv1.PortMapping `json:"portMappings,omitempty"`
		Bandwidth    *cniv1.Bandwidth    `json:"bandwidth,omitempty"`
	} `json:"runtimeConfig,omitzero"`

	timeout time.Duration
}

// The values of egressCapability.
const (
	egressNarrow  = "narrow"
	egressReplace = "replace"
)

// egress is ADD's policies: the network's, and the container's own from
// the runtime's "egress" capability, which the daemon narrows to the
// network's; with "egressCapability": "replace", the container's alone,
// as the network's.
func (c *netConf) egress() (network, container *cniv1.Egress) {
	if c.EgressCapability == egressReplace && c.RuntimeConfig.Egress != nil {
		return c.RuntimeConfig.Egress, nil
	}
	return c.Egress, c.RuntimeConfig.Egress
}

func main() {
	if err := boundStdin(); err != nil {
		_ = err.Print()
		os.Exit(1)
	}
	skel.PluginMainFuncs(skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus},
		version.PluginSupports("0.4.0", "1.0.0", "1.1.0"), "phasegate-cni: phasegate slots for containers")
}

// boundStdin reads at most maxStdin bytes of the configuration on stdin,
// before skel reads it whole, and fails with the spec's code for an
// invalid configuration (7) at the first byte beyond, without reading
// the rest; else it gives skel what it read, as stdin. skel reads no stdin
// for VERSION, nor without CNI_COMMAND: neither does it.
func boundStdin() *types.Error {
	if cmd := os.Getenv("CNI_COMMAND"); cmd == "" || cmd == "VERSION" {
		return nil
	}
	b, err := io.ReadAll(io.LimitReader(os.Stdin, maxStdin+1))
	switch {
	case err != nil:
		return types.NewError(types.ErrIOFailure, "read the network configuration on stdin", err.Error())
	case len(b) > maxStdin:
		return types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("the network configuration on stdin is over %d bytes", maxStdin),
			"a CNI configuration is kilobytes; the daemon takes no request over 1 MiB")
	}
	fd, err := unix.MemfdCreate("stdin", unix.MFD_CLOEXEC)
	if err != nil {
		return types.NewError(types.ErrIOFailure, "hold the network configuration", err.Error())
	}
	f := os.NewFile(uintptr(fd), "stdin")
	if _, err := f.Write(b); err != nil {
		return types.NewError(types.ErrIOFailure, "hold the network configuration", err.Error())
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return types.NewError(types.ErrIOFailure, "hold the network configuration", err.Error())
	}
	os.Stdin = f
	return nil
}

// loadConf reads the configuration on stdin, with its defaults.
func loadConf(stdin []byte) (*netConf, error) {
	conf := &netConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		var be *cniv1.BandwidthError
		if errors.As(err, &be) {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, "the runtime's bandwidth capability is not ingressRate, ingressBurst, egressRate and egressBurst in whole bits", be.Error())
		}
		return nil, types.NewError(types.ErrDecodingFailure, "decode the network configuration", err.Error())
	}
	if conf.Name == "" {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "the network configuration has no name", "")
	}
	switch conf.EgressCapability {
	case "", egressNarrow, egressReplace:
	default:
		return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("egressCapability %q: want %q (the default) or %q", conf.EgressCapability, egressNarrow, egressReplace), "")
	}
	if conf.Socket == "" {
		conf.Socket = defaultSocket
	}
	conf.timeout = defaultTimeout
	if conf.Timeout != "" {
		d, err := time.ParseDuration(conf.Timeout)
		if err != nil || d <= 0 {
			return nil, types.NewError(types.ErrInvalidNetworkConfig, fmt.Sprintf("timeout %q: want a positive duration such as \"30s\"", conf.Timeout), "")
		}
		conf.timeout = d
	}
	if err := version.ParsePrevResult(&conf.PluginConf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "decode prevResult", err.Error())
	}
	return conf, nil
}

// call makes one verb's call on the daemon, waiting for it while it is
// down or starting, up to the configuration's timeout; netns, when set, is
// passed with it.
func (c *netConf) call(path string, netns *os.File, req, answer any) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	err := cniv1.Client{Socket: c.Socket, File: netns}.Wait(ctx, retryInterval, path, req, answer)
	return asTypesError(err, types.ErrTryAgainLater)
}

// openNetns opens CNI_NETNS as the daemon takes it: with this process's
// own credentials, in its own mount namespace, checked to be a network
// namespace. The daemon opens no path for a caller but root: what this
// process cannot open, it cannot attach to, and nothing tells it more than
// its own open does. The messages do not repeat the path, which the
// runtime knows: two paths refused alike are answered alike.
func openNetns(path string) (*os.File, error) {
	fd, err := netns.OpenForeign(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, types.NewError(types.ErrUnknownContainer, "CNI_NETNS does not exist", "")
	case errors.Is(err, netns.ErrNotNamespace):
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS is not a namespace: want a network namespace's file (a bind mount, /proc/<pid>/ns/net)", "")
	case err != nil:
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS cannot be opened: "+err.Error(), "")
	}
	return os.NewFile(uintptr(fd), path), nil
}

// asTypesError is err as the spec's error object: the daemon's code, or
// unavailable as the given code.
func asTypesError(err error, unavailable uint) error {
	var de *cniv1.Error
	var un *cniv1.UnavailableError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &de):
		return &types.Error{Code: de.Code, Msg: de.Msg, Details: de.Details}
	case errors.As(err, &un):
		return types.NewError(unavailable, err.Error(), "")
	}
	return types.NewError(types.ErrIOFailure, err.Error(), "")
}

func key(conf *netConf, args *skel.CmdArgs) cniv1.Key {
	return cniv1.Key{Network: conf.Name, ContainerID: args.ContainerID, IfName: args.IfName}
}

// loadConfIn loads the configuration of a verb that acts in the
// container's namespace (ADD, CHECK), which CNI_NETNS must name.
func loadConfIn(args *skel.CmdArgs, verb string) (*netConf, error) {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return nil, err
	}
	if args.Netns == "" {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS is required for "+verb, "")
	}
	return conf, nil
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := loadConfIn(args, "ADD")
	if err != nil {
		return err
	}
	k := key(conf, args)
	var ke *cniv1.KeyError
	if err := k.Check(); errors.As(err, &ke) {
		return types.NewError(ke.Code, err.Error(), "")
	}
	ns, err := openNetns(args.Netns)
	if err != nil {
		return err
	}
	defer ns.Close()
	var a cniv1.Attachment
	req := cniv1.AddRequest{Key: k, Netns: args.Netns}
	req.Egress, req.ContainerEgress = conf.egress()
	req.Ports = conf.RuntimeConfig.PortMappings
	req.Bandwidth = conf.RuntimeConfig.Bandwidth
	if err := conf.call(cniv1.PathAdd, ns, req, &a); err != nil {
		return err
	}
	res, err := result(conf, a)
	if err != nil {
		return err
	}
	return types.PrintResult(res, conf.CNIVersion)
}

// result is ADD's result: the host end and the container's end, the
// address and the default route, after what a plugin before this one in
// the conflist returned.
func result(conf *netConf, a cniv1.Attachment) (*current.Result, error) {
	ip, ipnet, err := net.ParseCIDR(a.Address)
	gw := net.ParseIP(a.Gateway)
	if err != nil || gw == nil {
		return nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("the daemon answered address %q and gateway %q", a.Address, a.Gateway), "")
	}
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if conf.PrevResult != nil {
		prev, err := current.NewResultFromResult(conf.PrevResult)
		if err != nil {
			return nil, types.NewError(types.ErrDecodingFailure, "convert prevResult", err.Error())
		}
		res = prev
	}
	inside := len(res.Interfaces) + 1
	res.Interfaces = append(res.Interfaces,
		&current.Interface{Name: a.HostIf, Mac: a.HostMAC},
		&current.Interface{Name: a.IfName, Mac: a.MAC, Sandbox: a.Netns})
	res.IPs = append(res.IPs, &current.IPConfig{Interface: current.Int(inside), Address: net.IPNet{IP: ip, Mask: ipnet.Mask}, Gateway: gw})
	res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}, GW: gw})
	if a.Address6 != "" {
		// A dual-stack slot: its IPv6 address and default route beside.
		ip6, net6, err := net.ParseCIDR(a.Address6)
		gw6 := net.ParseIP(a.Gateway6)
		if err != nil || gw6 == nil || ip6.To4() != nil {
			return nil, types.NewError(types.ErrIOFailure, fmt.Sprintf("the daemon answered IPv6 address %q and gateway %q", a.Address6, a.Gateway6), "")
		}
		res.IPs = append(res.IPs, &current.IPConfig{Interface: current.Int(inside), Address: net.IPNet{IP: ip6, Mask: net6.Mask}, Gateway: gw6})
		res.Routes = append(res.Routes, &types.Route{Dst: net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}, GW: gw6})
	}
	return res, nil
}

func cmdDel(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	return conf.call(cniv1.PathDel, nil, cniv1.DelRequest{Key: key(conf, args)}, nil)
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := loadConfIn(args, "CHECK")
	if err != nil {
		return err
	}
	ns, err := openNetns(args.Netns)
	if err != nil {
		return err
	}
	defer ns.Close()
	return conf.call(cniv1.PathCheck, ns, cniv1.CheckRequest{Key: key(conf, args), Netns: args.Netns}, nil)
}

func cmdGC(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	req := cniv1.GCRequest{Network: conf.Name, Valid: make([]cniv1.ValidKey, 0, len(conf.ValidAttachments))}
	for _, v := range conf.ValidAttachments {
		req.Valid = append(req.Valid, cniv1.ValidKey{ContainerID: v.ContainerID, IfName: v.IfName})
	}
	return conf.call(cniv1.PathGC, nil, req, &cniv1.GCAnswer{})
}

// cmdStatus answers at once: 50 while the daemon is down, starting or
// draining (with its phase and progress), 51 while it serves degraded.
func cmdStatus(args *skel.CmdArgs) error {
	conf, err := loadConf(args.StdinData)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), conf.timeout)
	defer cancel()
	var st cniv1.StatusAnswer
	if err := (cniv1.Client{Socket: conf.Socket}).Call(ctx, cniv1.PathStatus, struct{}{}, &st); err != nil {
		return asTypesError(err, cniv1.CodeNotAvailable)
	}
	if st.Degraded != "" {
		return types.NewError(cniv1.CodeLimited, st.Degraded, "")
	}
	return nil
}
