package cniapi

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc/codes"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
)

// mayJoin refuses a namespace no slot may join: one that holds the inside
// end of a slot not attached to it (a slot's own namespace: the slot
// would join another tenant's workload), and an attached slot's own
// namespace (which holds only its parked pair's end). A container's namespace that holds the ends of its
// other attachments (another network of the same container) may.
// slot.Manager.Attach refuses the host's namespace and the slot's own
// itself.
func (c *Service) mayJoin(to *attachTarget) error {
	held, err := c.slots.Manager().SlotsIn(to.fd)
	if err != nil {
		return cniErr(codes.Internal, cniv1.CodeIOFailure, fmt.Sprintf("CNI_NETNS %s: %v", to.path, err))
	}
	for _, i := range held {
		l := c.slots.At(i)
		if l == nil || l.Rec.Attachment == nil || l.Rec.Attachment.Netns != to.id {
			return cniErr(codes.PermissionDenied, cniv1.CodeRefused,
				fmt.Sprintf("CNI_NETNS %s holds the inside end of slot %d: it is a slot's namespace, not a container's", to.path, i))
		}
	}
	if i, ok := c.slots.SlotOwning(to.id); ok {
		return cniErr(codes.PermissionDenied, cniv1.CodeRefused, fmt.Sprintf("CNI_NETNS %s is slot %d's own namespace, not a container's", to.path, i))
	}
	return nil
}

// keyLocks serialises the calls on one attachment key: an ADD holds its
// key from before its record until its lease is in the table, and a DEL
// of the key waits for it. A runtime sends DEL for an ADD that timed out,
// perhaps while that ADD is still under way: the DEL must end what the
// ADD made, not find nothing and let it stay.
type keyLocks struct {
	mu   sync.Mutex
	held map[string]*keyLock
}

// keyLock is one key's lock: a 1-slot channel, so that a wait for it can
// end with its context.
type keyLock struct {
	token chan struct{}
	refs  int
}

// lock takes the lock of key, waiting for its holder or until ctx ends,
// and returns its release.
func (k *keyLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.held == nil {
		k.held = map[string]*keyLock{}
	}
	l := k.held[key]
	if l == nil {
		l = &keyLock{token: make(chan struct{}, 1)}
		k.held[key] = l
	}
	l.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(k.held, key)
		}
		k.mu.Unlock()
	}
	select {
	case l.token <- struct{}{}:
		return func() { <-l.token; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
