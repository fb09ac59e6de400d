// Command grpc links what a CNI plugin needs and a grpc-go client with the
// health service's stubs: a plugin that speaks gRPC to its daemon.
package main

import (
	_ "net"

	_ "github.com/containernetworking/cni/pkg/skel"
	_ "github.com/containernetworking/cni/pkg/types/100"
	_ "google.golang.org/grpc"
	_ "google.golang.org/grpc/credentials/insecure"
	_ "google.golang.org/grpc/health/grpc_health_v1"
)

func main() {}
