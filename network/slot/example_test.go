package slot_test

import (
	"fmt"

	"github.com/phasegate/phasegate/network/slot"
)

// A Config names every object of a slot and cuts its addresses without
// touching the kernel; reclaim uses the parsers to tell our leftovers from
// look-alikes it must never touch.
func ExampleConfig() {
	c := slot.DefaultConfig()
	host, inside := c.Addrs(7)
	fmt.Println(c.NetnsPath(7), c.HostIfName(7), slot.InsideIfName, host, inside, c.TableName())
	if err := c.Validate(); err != nil {
		fmt.Println(err)
	}

	for _, name := range []string{"pg-7", "pg-007", "pg-2048", "other-7"} {
		i, ours := c.ParseNetnsName(name)
		j, canonical := c.CanonicalNetnsIndex(name)
		fmt.Printf("%-8s in range: %-5v %d  ours: %-5v %d\n", name, ours, i, canonical, j)
	}
	// Output:
	// /run/netns/pg-7 pg-h7 eth0 169.254.128.12/31 169.254.128.13/31 phasegate_pg_
	// pg-7     in range: true  7  ours: true  7
	// pg-007   in range: false 0  ours: false 0
	// pg-2048  in range: false 0  ours: true  2048
	// other-7  in range: false 0  ours: false 0
}

// Validate reports every problem at once.
func ExampleConfig_Validate() {
	c := slot.DefaultConfig()
	c.Prefix = "Pg7"
	c.NetnsDir = "run/netns"
	fmt.Println(c.Validate())
	// Output:
	// invalid slot config: prefix "Pg7": use lowercase letters, digits and '-', start with a letter, do not end with a digit
	// invalid slot config: netns dir "run/netns" is not absolute
}
