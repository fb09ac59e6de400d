// Command nethttp links what a CNI plugin needs and net/http: a plugin
// that speaks HTTP to its daemon.
package main

import (
	_ "net"
	_ "net/http"

	_ "github.com/containernetworking/cni/pkg/skel"
	_ "github.com/containernetworking/cni/pkg/types/100"
)

func main() {}
