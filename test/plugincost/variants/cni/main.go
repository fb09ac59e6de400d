// Command cni links what any CNI plugin in Go needs: the CNI library's
// skel and types, and net.
package main

import (
	_ "net"

	_ "github.com/containernetworking/cni/pkg/skel"
	_ "github.com/containernetworking/cni/pkg/types/100"
)

func main() {}
