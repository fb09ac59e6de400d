package cniv1

import (
	"fmt"

	"github.com/phasegate/phasegate/internal/names"
)

// KeyError is a key [Key.Check] refuses: which rule, and the CNI spec's
// code a plugin answers it with.
type KeyError struct {
	// Code is CodeInvalidConfig for the network's name (the
	// configuration's), CodeInvalidEnvironment for the container id and
	// the interface name (CNI_CONTAINERID, CNI_IFNAME).
	Code uint
	Err  error
}

func (e *KeyError) Error() string { return e.Err.Error() }

func (e *KeyError) Unwrap() error { return e.Err }

// Check returns nil if k is a key every door takes: the plugin before it
// calls, the daemon's CNI routes and the Slots API (for an owner under
// [OwnerPrefix]) all check it here, so that none holds a key another
// would refuse. The network's name and the container id follow the CNI
// spec's rule, the interface name the kernel's, all three the names rule
// (internal/names: printable ASCII, no NUL); the lease's owner and request
// id stay within a name's length. Else it returns a [*KeyError].
func (k Key) Check() error {
	if err := names.CheckCNIName("network name", k.Network); err != nil {
		return &KeyError{Code: CodeInvalidConfig, Err: err}
	}
	if len(k.Owner()) > names.MaxLen {
		return &KeyError{Code: CodeInvalidConfig, Err: fmt.Errorf("network name is %d bytes: at most %d", len(k.Network), names.MaxLen-len(OwnerPrefix))}
	}
	if err := names.CheckCNIName("CNI_CONTAINERID", k.ContainerID); err != nil {
		return &KeyError{Code: CodeInvalidEnvironment, Err: err}
	}
	if err := names.CheckIfName("CNI_IFNAME", k.IfName); err != nil {
		return &KeyError{Code: CodeInvalidEnvironment, Err: err}
	}
	if len(k.RequestID()) > names.MaxLen {
		return &KeyError{Code: CodeInvalidEnvironment, Err: fmt.Errorf("CNI_CONTAINERID and CNI_IFNAME together are %d bytes: at most %d", len(k.RequestID())-1, names.MaxLen-1)}
	}
	return nil
}
