package phases

import "github.com/phasegate/phasegate/phases/internal/leasetest"

// The tests' slot host, principals and callers (internal/leasetest).
var (
	newSlotHost = leasetest.NewSlotHost
	root        = leasetest.Root
	alice       = leasetest.Alice
	as          = leasetest.As
)
