// Command noskel links what a CNI plugin in Go needs without the CNI
// library's skel: its types and version, encoding/json and net. skel
// brings pkg/ns and pkg/utils (vishvananda/netns, x/sys/unix, regexp),
// which a plugin that moves no link itself does not use.
package main

import (
	_ "encoding/json"
	_ "net"

	_ "github.com/containernetworking/cni/pkg/types/100"
	_ "github.com/containernetworking/cni/pkg/version"
)

func main() {}
