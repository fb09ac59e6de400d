package cniv1

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// The routes of the control socket, each a POST of one request. Status is
// served while the daemon starts too: its refusal then is the answer.
const (
	PathAdd    = "/cni/v1/add"
	PathDel    = "/cni/v1/del"
	PathCheck  = "/cni/v1/check"
	PathGC     = "/cni/v1/gc"
	PathStatus = "/cni/v1/status"
)

// OwnerPrefix begins the owner of every attachment's lease.
const OwnerPrefix = "cni/"

// Key names an attachment as the CNI spec does: the network's name (the
// conflist's), the container's id and the interface's name inside it.
type Key struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// Owner is the owner of the attachment's lease: "cni/<network>", which the
// control policy grants like any owner.
func (k Key) Owner() string { return OwnerPrefix + k.Network }

// RequestID is the attachment's request id under its owner:
// "<container id>/<ifname>", unique per key, so that a repeated ADD finds
// the first one's lease and nothing is handed out twice.
func (k Key) RequestID() string { return k.ContainerID + "/" + k.IfName }

// Egress is an attachment's egress policy (the Slots API's EgressPolicy):
// CIDRs to allow and deny, or everything denied but replies.
type Egress struct {
	Allow   []string `json:"allow,omitempty"`
	Deny    []string `json:"deny,omitempty"`
	DenyAll bool     `json:"denyAll,omitempty"`
}

// GetAllow, GetDeny, GetDenyAll and GetRedirectTcp read the policy as the
// daemon reads the Slots API's (its egress.Message), nil-safe as a
// protobuf message's getters are: one parse for both. An attachment's
// policy never sends to the egress proxy.
func (e *Egress) GetAllow() []string {
	if e == nil {
		return nil
	}
	return e.Allow
}

// GetDeny is the deny list (see GetAllow).
func (e *Egress) GetDeny() []string {
	if e == nil {
		return nil
	}
	return e.Deny
}

// GetDenyAll is DenyAll (see GetAllow).
func (e *Egress) GetDenyAll() bool { return e != nil && e.DenyAll }

// GetRedirectTcp is false: the CNI wire has no redirection (see GetAllow).
func (e *Egress) GetRedirectTcp() bool { return false }

// UnmarshalJSON reads a policy strictly: a misspelt key ("alow") would
// otherwise leave a policy weaker than the operator wrote, silently.
func (e *Egress) UnmarshalJSON(b []byte) error {
	type plain Egress
	var p plain
	if err := decodeStrict(b, &p); err != nil {
		return fmt.Errorf("egress policy: %w", err)
	}
	*e = Egress(p)
	return nil
}

// decodeStrict decodes b into v, refusing a key v has no field for.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// AddRequest asks for a slot attached to the namespace at Netns.
type AddRequest struct {
	Key
	// Netns is CNI_NETNS: the path of the container's network namespace.
	Netns string `json:"netns"`
	// Egress is the network's egress policy (the conflist's); nil for
	// none.
	Egress *Egress `json:"egress,omitempty"`
	// ContainerEgress is the container's own policy (the runtime's
	// "egress" capability args), which the daemon narrows to Egress: the
	// attachment lets out only what both let out. Nil: the network's
	// alone. A conflist that lets the container's replace the network's
	// ("egressCapability": "replace") sends it as Egress instead.
	ContainerEgress *Egress `json:"containerEgress,omitempty"`
	// Ports are the container's published ports (the runtime's
	// "portMappings" capability args), DNAT'd on the host before ADD
	// answers and withdrawn by DEL and GC.
	Ports []PortMapping `json:"ports,omitempty"`
	// Bandwidth is the container's bandwidth limits (the runtime's
	// "bandwidth" capability args); nil: none.
	Bandwidth *Bandwidth `json:"bandwidth,omitempty"`
}

// Bandwidth is an attachment's bandwidth limits as CNI's "bandwidth"
// capability gives them (the kubelet's kubernetes.io/ingress-bandwidth
// and egress-bandwidth): rates in bits per second, bursts in bits, into
// the container (ingress) and out of it (egress); 0 is unset. The daemon
// checks them as the Slots API's Bandwidth.
type Bandwidth struct {
	IngressRate  uint64 `json:"ingressRate,omitempty"`
	IngressBurst uint64 `json:"ingressBurst,omitempty"`
	EgressRate   uint64 `json:"egressRate,omitempty"`
	EgressBurst  uint64 `json:"egressBurst,omitempty"`
}

// BandwidthError is a "bandwidth" capability whose JSON is no limits: a
// key that is none of the four, or a value that is not a whole number of
// bits from 0 to 2^64-1 (a negative, a fraction, a string).
type BandwidthError struct{ Err error }

// Error names the capability and what is wrong with it.
func (e *BandwidthError) Error() string { return "bandwidth: " + e.Err.Error() }

// Unwrap is the decoder's error.
func (e *BandwidthError) Unwrap() error { return e.Err }

// UnmarshalJSON reads limits strictly: a misspelt key ("ingresRate")
// would otherwise leave a container unlimited, silently.
func (b *Bandwidth) UnmarshalJSON(data []byte) error {
	type plain Bandwidth
	var p plain
	if err := decodeStrict(data, &p); err != nil {
		return &BandwidthError{Err: err}
	}
	*b = Bandwidth(p)
	return nil
}

// PortMapping is one entry of the "portMappings" capability's args, as
// the CNI conventions spell it (podman's -p, Kubernetes' hostPort, Nomad's
// port blocks): an empty protocol is tcp, an empty hostIP every address
// of the host.
type PortMapping struct {
	HostPort      uint32 `json:"hostPort"`
	ContainerPort uint32 `json:"containerPort"`
	Protocol      string `json:"protocol,omitempty"`
	HostIP        string `json:"hostIP,omitempty"`
}

// GetHostIp, GetHostPort, GetSlotPort and GetProtocol read the mapping as
// the Slots API's PublishedPort reads (ports.Message).
func (p PortMapping) GetHostIp() string { return p.HostIP }

// GetHostPort is the host port.
func (p PortMapping) GetHostPort() uint32 { return p.HostPort }

// GetSlotPort is the container's port.
func (p PortMapping) GetSlotPort() uint32 { return p.ContainerPort }

// GetProtocol is the protocol, "" for tcp.
func (p PortMapping) GetProtocol() string { return p.Protocol }

// Attachment is what ADD made: the slot, its two ends and the addresses.
// A repeated ADD of the same key answers the same.
type Attachment struct {
	Slot int `json:"slot"`
	// HostIf and HostMAC are the host end, in the host's namespace.
	HostIf  string `json:"hostIf"`
	HostMAC string `json:"hostMac"`
	// IfName and MAC are the container's end, in Netns.
	IfName string `json:"ifName"`
	MAC    string `json:"mac"`
	Netns  string `json:"netns"`
	// Address is the container end's address with its prefix
	// ("169.254.0.1/31"); Gateway the host end's, the default route's
	// next hop.
	Address string `json:"address"`
	Gateway string `json:"gateway"`
	// Address6 and Gateway6 are the same of IPv6 ("fd00::1/127"), on a
	// daemon with IPv6 slots (--slot-cidr6); empty without.
	Address6 string `json:"address6,omitempty"`
	Gateway6 string `json:"gateway6,omitempty"`
}

// DelRequest ends an attachment; an unknown key is not an error.
type DelRequest struct {
	Key
}

// CheckRequest asks whether the attachment is as ADD left it.
type CheckRequest struct {
	Key
	Netns string `json:"netns"`
}

// GCRequest ends every attachment of Network whose container id and
// ifname are not in Valid (the runtime's cni.dev/valid-attachments).
type GCRequest struct {
	Network string     `json:"network"`
	Valid   []ValidKey `json:"valid"`
}

// ValidKey is one attachment a runtime still knows.
type ValidKey struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
}

// GCAnswer says how many attachments GC ended, and which of those the
// runtime did not list it kept, and why: a GC ends only what its caller
// may end (its principal's own attachments; root, every one). The spec's
// GC prints nothing on success, so the plugin does not show it: the
// daemon's audit line does.
type GCAnswer struct {
	Released int              `json:"released"`
	Kept     []KeptAttachment `json:"kept,omitempty"`
}

// KeptAttachment is an attachment GC did not end though the runtime did
// not list it.
type KeptAttachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	// Principal made the attachment.
	Principal string `json:"principal"`
	// Reason says why the caller may not end it.
	Reason string `json:"reason"`
}

// StatusAnswer is the daemon's answer to STATUS while it serves.
type StatusAnswer struct {
	// Degraded names what keeps the daemon's datapath from being whole
	// (its warnings: restored leases being verified, forwarding off), ""
	// when nothing does: the plugin answers [CodeLimited] with it.
	Degraded string `json:"degraded,omitempty"`
}

// Error codes of the CNI spec, and phasegate's own (100 and above).
const (
	CodeIncompatibleVersion = 1
	CodeUnsupportedField    = 2
	CodeUnknownContainer    = 3
	CodeInvalidEnvironment  = 4
	CodeIOFailure           = 5
	CodeDecodingFailure     = 6
	CodeInvalidConfig       = 7
	CodeTryAgainLater       = 11
	// CodeNotAvailable: STATUS while the daemon starts or drains.
	CodeNotAvailable = 50
	// CodeLimited: STATUS while the daemon serves degraded.
	CodeLimited = 51
	// CodeRefused: the control policy does not let the caller do this.
	CodeRefused = 100
	// CodeIfNameTaken: the container's namespace has a link of the name.
	CodeIfNameTaken = 101
	// CodeCheckFailed: CHECK found the attachment not as ADD left it.
	CodeCheckFailed = 102
)

// Error is a refusal or failure the daemon answered, in the CNI spec's
// terms: a code (the spec's, or phasegate's from 100) and a one-line
// message naming the problem.
type Error struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

// Error is the message and its details, on one line.
func (e *Error) Error() string {
	if e.Details != "" {
		return fmt.Sprintf("%s: %s", e.Msg, e.Details)
	}
	return e.Msg
}

// UnavailableError is a call the daemon did not take: nothing listens on
// the socket (the daemon is down or restarting), or it answered that it
// does not serve yet (starting, with its phase and progress) or any more
// (draining). Nothing was changed: the call may be made again.
type UnavailableError struct {
	Reason string
}

// Error says that the daemon is not available, and why.
func (e *UnavailableError) Error() string { return "phasegate daemon not available: " + e.Reason }
