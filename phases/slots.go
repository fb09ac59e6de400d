package phases

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/network/storage"
)

// slotsServiceName is the Slots API's full gRPC name.
const slotsServiceName = "phasegate.v1.Slots"

// maxOwnerLen bounds Acquire's owner: it is logged and listed.
const maxOwnerLen = 256

func slotsServiceDesc() *grpc.ServiceDesc { return &phasegatev1.Slots_ServiceDesc }

// slotsService implements phasegate.v1.Slots over the pool and storage.
type slotsService struct {
	phasegatev1.UnimplementedSlotsServer

	cfg   slot.Config
	store *storage.Storage
	pool  *pool.Pool
	log   *slog.Logger

	mu       sync.Mutex
	acquired map[int]*lease
}

// lease is a slot handed to an owner.
type lease struct {
	slot  *slot.Slot
	owner string
	since time.Time
}

func newSlotsService(cfg slot.Config, store *storage.Storage, pl *pool.Pool, log *slog.Logger) *slotsService {
	return &slotsService{cfg: cfg, store: store, pool: pl, log: log, acquired: map[int]*lease{}}
}

func validOwner(owner string) error {
	switch {
	case owner == "":
		return errors.New("owner is required")
	case len(owner) > maxOwnerLen:
		return fmt.Errorf("owner is %d bytes, at most %d", len(owner), maxOwnerLen)
	}
	for _, r := range owner {
		if !unicode.IsPrint(r) || r == unicode.ReplacementChar {
			return errors.New("owner must be printable UTF-8")
		}
	}
	return nil
}

// checkIndex maps an index to a gRPC status error: 0 is not an index at all,
// one beyond --slots is one this daemon does not have.
func (s *slotsService) checkIndex(i uint32) error {
	switch {
	case i == 0:
		return status.Error(codes.InvalidArgument, "index is required (slots are numbered from 1)")
	case int64(i) > int64(s.cfg.Slots):
		return status.Errorf(codes.NotFound, "slot %d does not exist (slots are 1..%d)", i, s.cfg.Slots)
	}
	return nil
}

// Acquire implements phasegate.v1.Slots.
func (s *slotsService) Acquire(ctx context.Context, req *phasegatev1.AcquireRequest) (*phasegatev1.AcquireResponse, error) {
	if err := validOwner(req.GetOwner()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	sl, err := s.pool.Get(ctx)
	switch {
	case errors.Is(err, pool.ErrClosed):
		return nil, status.Error(codes.Unavailable, "draining: the slot pool is closed")
	case errors.Is(err, storage.ErrExhausted):
		return nil, status.Errorf(codes.ResourceExhausted, "all %d slots are in use or quarantined", s.cfg.Slots)
	case ctx.Err() != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	case err != nil:
		return nil, status.Errorf(codes.Internal, "make a slot: %v", err)
	}
	l := &lease{slot: sl, owner: req.GetOwner(), since: time.Now()}
	s.mu.Lock()
	s.acquired[sl.Index] = l
	s.mu.Unlock()
	s.log.Info("slot acquired", "slot", sl.Index, "owner", l.owner)
	return &phasegatev1.AcquireResponse{Slot: s.describe(sl.Index, phasegatev1.SlotState_SLOT_STATE_ACQUIRED, l)}, nil
}

// Release implements phasegate.v1.Slots.
func (s *slotsService) Release(ctx context.Context, req *phasegatev1.ReleaseRequest) (*phasegatev1.ReleaseResponse, error) {
	if err := s.checkIndex(req.GetIndex()); err != nil {
		return nil, err
	}
	i := int(req.GetIndex())
	s.mu.Lock()
	l, ok := s.acquired[i]
	delete(s.acquired, i) // taken under the lock: a concurrent double release fails
	s.mu.Unlock()
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "slot %d is not acquired", i)
	}
	// Put resets the slot for its next owner, or destroys it when it cannot:
	// either way the caller no longer has it.
	if err := s.pool.Put(context.WithoutCancel(ctx), l.slot); err != nil {
		s.log.Warn("released slot could not be reset; destroyed", "slot", i, "owner", l.owner, "error", err)
	}
	s.log.Info("slot released", "slot", i, "owner", l.owner, "held", time.Since(l.since).Round(time.Millisecond).String())
	return &phasegatev1.ReleaseResponse{}, nil
}

// Get implements phasegate.v1.Slots.
func (s *slotsService) Get(_ context.Context, req *phasegatev1.GetRequest) (*phasegatev1.GetResponse, error) {
	if err := s.checkIndex(req.GetIndex()); err != nil {
		return nil, err
	}
	all := s.states(true)
	return &phasegatev1.GetResponse{Slot: all[req.GetIndex()-1]}, nil
}

// List implements phasegate.v1.Slots.
func (s *slotsService) List(_ context.Context, req *phasegatev1.ListRequest) (*phasegatev1.ListResponse, error) {
	return &phasegatev1.ListResponse{Slots: s.states(req.GetIncludeFree())}, nil
}

// states describes every slot (indices 1..N in order), or every slot that is
// not free.
func (s *slotsService) states(includeFree bool) []*phasegatev1.Slot {
	ps := s.pool.Snapshot()
	ss := s.store.Snapshot()
	s.mu.Lock()
	leases := make(map[int]*lease, len(s.acquired))
	for i, l := range s.acquired {
		leases[i] = l
	}
	s.mu.Unlock()

	// A set, not a search of ps.Idle per index: List walks every index.
	idle := make(map[int]bool, len(ps.Idle))
	for _, i := range ps.Idle {
		idle[i] = true
	}
	var out []*phasegatev1.Slot
	for i := 1; i <= ss.N; i++ {
		st := phasegatev1.SlotState_SLOT_STATE_FREE
		switch {
		case leases[i] != nil:
			st = phasegatev1.SlotState_SLOT_STATE_ACQUIRED
		case idle[i]:
			st = phasegatev1.SlotState_SLOT_STATE_WARM
		case ss.States[i-1] == storage.Quarantined:
			st = phasegatev1.SlotState_SLOT_STATE_QUARANTINED
		case ss.States[i-1] != storage.Free:
			st = phasegatev1.SlotState_SLOT_STATE_BUSY // being made, reset or destroyed
		}
		if st == phasegatev1.SlotState_SLOT_STATE_FREE && !includeFree {
			continue
		}
		out = append(out, s.describe(i, st, leases[i]))
	}
	return out
}

func (s *slotsService) describe(i int, st phasegatev1.SlotState, l *lease) *phasegatev1.Slot {
	sl := s.cfg.Slot(i)
	out := &phasegatev1.Slot{
		Index:           uint32(i),
		State:           st,
		NetnsName:       sl.NetnsName,
		NetnsPath:       sl.NetnsPath,
		HostInterface:   sl.HostIf,
		InsideInterface: sl.InsideIf,
		HostAddress:     sl.HostAddr.String(),
		InsideAddress:   sl.InsideAddr.String(),
	}
	if l != nil {
		out.Owner = l.owner
		out.AcquiredAt = timestamppb.New(l.since)
	}
	return out
}

// takeAll removes and returns every acquired slot, for the drain.
func (s *slotsService) takeAll() []*slot.Slot {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*slot.Slot
	for i, l := range s.acquired {
		out = append(out, l.slot)
		delete(s.acquired, i)
	}
	return out
}

// debugHandler serves List as JSON at /debug/slots (?all=1 adds free ones).
func (s *slotsService) debugHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		list := &phasegatev1.ListResponse{Slots: s.states(r.URL.Query().Has("all"))}
		b, err := protojson.MarshalOptions{Multiline: true, UseProtoNames: true}.Marshal(list)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(append(b, '\n'))
	})
}
