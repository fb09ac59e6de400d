package lease

import (
	"strings"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
)

// isCNIOwner reports whether owner is a CNI network's, whose leases are
// attachments.
func isCNIOwner(owner string) bool { return strings.HasPrefix(owner, cniv1.OwnerPrefix) }

// refuseCNIOwner refuses an Acquire for owner if it is a CNI network's.
func refuseCNIOwner(owner string) error {
	if !isCNIOwner(owner) {
		return nil
	}
	return Errorf(ErrDenied, "owner %q is a CNI network's: its leases are attachments, made only by the CNI plugin's ADD (with attach for the network), never by Acquire", owner)
}
