package nft_test

import (
	"context"
	"log"
	"net/netip"

	"github.com/phasegate/phasegate/network/nft"
)

// Tenants that are one party may talk to each other, and every slot may
// use a DNS resolver on the host end of its veth.
func ExampleNew() {
	tbl, err := nft.New(nft.TableName("pg-"), nft.WithSlotNetwork(netip.MustParsePrefix("169.254.128.0/19")), nft.WithIsolation(nft.Isolation{
		AllowSlotToSlot: true,
		HostUDPPorts:    []uint16{53},
		HostTCPPorts:    []uint16{53},
	}))
	if err != nil {
		log.Fatal(err)
	}
	if err := tbl.Ensure(context.Background()); err != nil {
		log.Fatal(err)
	}
	d, err := tbl.Drops(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	log.Printf("dropped: %d to the host, %d inbound", d.ToHost, d.Inbound)
}
