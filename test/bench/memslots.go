package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"
	"unicode"

	"golang.org/x/sync/singleflight"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/server"
)

// msgPoolReady is what `bench memslots` logs once its pool is full.
const msgPoolReady = "pool ready"

// memslotsMain is the `memslots` subcommand: the in-memory baseline of the
// Acquire comparison. It serves phasegate.v1.Slots the way the daemon does
// — on a Unix socket, as the daemon serves it on its control socket, with
// the same server (package server: cmux, late-bound services),
// the same pool, allocator and slot manager, the same checks of owner and
// request id, the same idempotent retries (one call per request at a time,
// a retry answered with the first call's lease), the same log line per
// lease — but keeps each lease in a map under a mutex instead of writing
// its record to the durable store before replying. What the daemon has and
// this has not: the lease record (a bbolt transaction with fsync, shared
// by concurrent writers) on Acquire, the idle record of every slot its pool
// makes, the daemon's metric interceptors, and the control guard (the
// caller's peer credentials, the policy, the audit line; the benchmark
// turns the rate limit off).
//
// It logs (JSON) "pool ready" once -pool-size slots are warm, serves until
// SIGINT/SIGTERM, then drains and closes the pool, which destroys the idle
// slots; leased ones are left for the caller to remove.
func memslotsMain(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("memslots", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg slot.Config
	socket := fs.String("control-socket", "", "path of the Unix socket to serve on")
	fs.StringVar(&cfg.NetnsDir, "netns-dir", "", "netns directory")
	fs.StringVar(&cfg.Prefix, "slot-prefix", "", "slot prefix")
	fs.IntVar(&cfg.Slots, "slots", 0, "slot indices")
	cidr := fs.String("slot-cidr", "", "slot CIDR")
	poolSize := fs.Int("pool-size", 16, "warm slots")
	workers := fs.Int("reclaim-workers", slot.DefaultWorkers, "teardown workers")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if !filepath.IsAbs(*socket) {
		fmt.Fprintln(stderr, "memslots: -control-socket: need an absolute path")
		return exitUsage
	}
	p, err := netip.ParsePrefix(*cidr)
	if err != nil {
		fmt.Fprintln(stderr, "memslots: -slot-cidr:", err)
		return exitUsage
	}
	cfg.CIDR = p
	log := slog.New(slog.NewJSONHandler(stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := serveMemSlots(ctx, *socket, cfg, *poolSize, *workers, log); err != nil {
		log.Error("memslots", "error", err)
		return exitError
	}
	return exitOK
}

func serveMemSlots(ctx context.Context, socket string, cfg slot.Config, poolSize, workers int, log *slog.Logger) error {
	mgr, err := slot.NewManager(ctx, cfg, slot.DefaultOptions())
	if err != nil {
		return err
	}
	idx, err := index.New(cfg.Slots, nil)
	if err != nil {
		return err
	}
	pl, err := pool.New(mgr, idx, pool.Options{
		Target:   poolSize,
		Grace:    5 * time.Minute,
		Teardown: slot.TeardownOptions{Workers: workers},
	})
	if err != nil {
		return err
	}
	defer func() {
		if err := pl.Close(context.Background()); err != nil {
			log.Warn("pool close", "error", err)
		}
	}()
	// The path is this benchmark's own: a socket an earlier run killed
	// left there is replaced.
	if err := os.Remove(socket); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: socket, Net: "unix"})
	if err != nil {
		return err
	}
	defer l.Close() // unlinks the path, if the server has not closed it
	sc := server.DefaultConfig()
	sc.Listener, sc.DrainDelay, sc.StopTimeout = l, 20*time.Millisecond, 5*time.Second
	srv, err := server.New(sc)
	if err != nil {
		return err
	}
	if err := srv.Declare(&phasegatev1.Slots_ServiceDesc); err != nil {
		return err
	}
	if err := srv.Serve(ctx); err != nil {
		return err
	}
	defer func() { _ = srv.Drain(context.Background()) }()
	if err := srv.Bind(phasegatev1.Slots_ServiceDesc.ServiceName, newMemSlots(cfg, pl, log)); err != nil {
		return err
	}
	if err := pl.WaitReady(ctx, poolSize); err != nil {
		return fmt.Errorf("wait for %d warm slots: %w", poolSize, err)
	}
	log.Info(msgPoolReady, "warm", poolSize)
	<-ctx.Done()
	return nil
}

// memLease is a lease kept in memory.
type memLease struct {
	slot      *slot.Slot
	owner     string
	leaseID   string
	requestID string
	acquired  time.Time
	ttl       time.Duration
}

// memSlots implements phasegate.v1.Slots with its leases in a map.
type memSlots struct {
	phasegatev1.UnimplementedSlotsServer

	cfg       slot.Config
	pool      *pool.Pool
	log       *slog.Logger
	acquiring singleflight.Group

	mu        sync.Mutex
	leased    map[int]*memLease
	byRequest map[string]int
}

func newMemSlots(cfg slot.Config, pl *pool.Pool, log *slog.Logger) *memSlots {
	return &memSlots{cfg: cfg, pool: pl, log: log, leased: map[int]*memLease{}, byRequest: map[string]int{}}
}

// maxIDLen bounds owner and request id, as the daemon does.
const maxIDLen = 256

func validID(what, id string, required bool) error {
	switch {
	case id == "" && required:
		return fmt.Errorf("%s is required", what)
	case len(id) > maxIDLen:
		return fmt.Errorf("%s is %d bytes, at most %d", what, len(id), maxIDLen)
	}
	for _, r := range id {
		if !unicode.IsPrint(r) || r == unicode.ReplacementChar {
			return fmt.Errorf("%s must be printable UTF-8", what)
		}
	}
	return nil
}

// Acquire implements phasegate.v1.Slots.
func (s *memSlots) Acquire(ctx context.Context, req *phasegatev1.AcquireRequest) (*phasegatev1.AcquireResponse, error) {
	if err := validID("owner", req.GetOwner(), true); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if err := validID("request_id", req.GetRequestId(), false); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ttl := req.GetTtl().AsDuration()
	if req.GetTtl() != nil && (!req.GetTtl().IsValid() || ttl < 0) {
		return nil, status.Error(codes.InvalidArgument, "ttl must be a non-negative duration")
	}
	var (
		l   *memLease
		err error
	)
	if req.GetRequestId() == "" {
		l, err = s.acquire(ctx, req.GetOwner(), "", ttl)
	} else {
		key := req.GetOwner() + "\x00" + req.GetRequestId()
		var v any
		v, err, _ = s.acquiring.Do(key, func() (any, error) {
			return s.acquire(ctx, req.GetOwner(), req.GetRequestId(), ttl)
		})
		if err == nil {
			l = v.(*memLease)
		}
	}
	if err != nil {
		return nil, err
	}
	return &phasegatev1.AcquireResponse{Slot: s.describe(l.slot.Index, l), LeaseId: l.leaseID}, nil
}

func (s *memSlots) acquire(ctx context.Context, owner, requestID string, ttl time.Duration) (*memLease, error) {
	key := owner + "\x00" + requestID
	if requestID != "" {
		s.mu.Lock()
		i, ok := s.byRequest[key]
		l := s.leased[i]
		s.mu.Unlock()
		if ok && l != nil {
			s.log.Info("slot acquire retried: same lease", "slot", i, "owner", owner, "request_id", requestID)
			return l, nil
		}
	}
	sl, err := s.pool.Get(ctx)
	switch {
	case errors.Is(err, pool.ErrClosed):
		return nil, status.Error(codes.Unavailable, "draining: the slot pool is closed")
	case errors.Is(err, index.ErrExhausted):
		return nil, status.Errorf(codes.ResourceExhausted, "all %d slots are leased or quarantined", s.cfg.Slots)
	case ctx.Err() != nil && err != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	case err != nil:
		return nil, status.Errorf(codes.Internal, "make a slot: %v", err)
	}
	l := &memLease{slot: sl, owner: owner, leaseID: leases.NewLeaseID(), requestID: requestID, acquired: time.Now(), ttl: ttl}
	s.mu.Lock()
	s.leased[sl.Index] = l
	if requestID != "" {
		s.byRequest[key] = sl.Index
	}
	s.mu.Unlock()
	s.log.Info("slot acquired", "slot", sl.Index, "owner", owner, "request_id", requestID, "ttl", ttl.String())
	return l, nil
}

// Release implements phasegate.v1.Slots.
func (s *memSlots) Release(ctx context.Context, req *phasegatev1.ReleaseRequest) (*phasegatev1.ReleaseResponse, error) {
	i := int(req.GetIndex())
	if i < 1 || i > s.cfg.Slots {
		return nil, status.Errorf(codes.NotFound, "slot %d does not exist", i)
	}
	s.mu.Lock()
	l := s.leased[i]
	if l == nil || l.leaseID != req.GetLeaseId() {
		s.mu.Unlock()
		return nil, status.Errorf(codes.PermissionDenied, "slot %d: lease_id is not this slot's lease", i)
	}
	delete(s.leased, i)
	delete(s.byRequest, l.owner+"\x00"+l.requestID)
	s.mu.Unlock()
	if err := s.pool.Put(context.WithoutCancel(ctx), l.slot); err != nil {
		s.log.Warn("released slot: teardown failed", "slot", i, "error", err)
	}
	return &phasegatev1.ReleaseResponse{}, nil
}

// Get implements phasegate.v1.Slots.
func (s *memSlots) Get(_ context.Context, req *phasegatev1.GetRequest) (*phasegatev1.GetResponse, error) {
	i := int(req.GetIndex())
	if i < 1 || i > s.cfg.Slots {
		return nil, status.Errorf(codes.NotFound, "slot %d does not exist", i)
	}
	s.mu.Lock()
	l := s.leased[i]
	s.mu.Unlock()
	return &phasegatev1.GetResponse{Slot: s.describe(i, l)}, nil
}

func (s *memSlots) describe(i int, l *memLease) *phasegatev1.Slot {
	sl := s.cfg.Slot(i)
	out := &phasegatev1.Slot{
		Index:           uint32(i),
		State:           phasegatev1.SlotState_SLOT_STATE_FREE,
		NetnsName:       sl.NetnsName,
		NetnsPath:       sl.NetnsPath,
		HostInterface:   sl.HostIf,
		InsideInterface: sl.InsideIf,
		HostAddress:     sl.HostAddr.String(),
		InsideAddress:   sl.InsideAddr.String(),
	}
	if l != nil {
		out.State = phasegatev1.SlotState_SLOT_STATE_ACQUIRED
		out.Owner = l.owner
		out.AcquiredAt = timestamppb.New(l.acquired)
		out.RequestId = l.requestID
		out.Ttl = durationpb.New(l.ttl)
	}
	return out
}
