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

	"google.golang.org/grpc"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/network/egress"
	"github.com/phasegate/phasegate/network/index"
	"github.com/phasegate/phasegate/network/leases"
	"github.com/phasegate/phasegate/network/pool"
	"github.com/phasegate/phasegate/network/slot"
	"github.com/phasegate/phasegate/phases"
	"github.com/phasegate/phasegate/server"
)

// msgPoolReady is what `bench memslots` logs once its pool is full.
const msgPoolReady = "pool ready"

// memslotsMain is the `memslots` subcommand: the in-memory baseline of the
// Acquire comparison. It serves phasegate.v1.Slots the way the daemon does
// — the daemon's own Slots service (phases.NewSlotsServer), behind a
// control guard (peer credentials, the policy — an empty one: root alone,
// as the benchmark calls — and the audit line), on a Unix socket as the
// daemon serves it on its control socket, with the same server (package
// server: cmux, late-bound services), the same pool, allocator and slot
// manager — but over a store that keeps the lease records in a map under
// a mutex (memStore) instead of bbolt. What the daemon has and this has
// not: the lease record on Acquire (an entry in the store's journal,
// shared by concurrent writers, fdatasync'd off tmpfs, written into bbolt
// when the writes pause), the idle record of every slot its pool
// makes, and the daemon's metric interceptors and tracing stats handler
// (otelgrpc; what they cost the daemon is in docs/BENCHMARKS.md).
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
	opts := slot.DefaultOptions()
	opts.Egress = egress.Defaults{AlwaysDeny: egress.DefaultAlwaysDeny}
	mgr, err := slot.NewManager(ctx, cfg, opts)
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
	// The daemon's guard on its control socket, with the daemon's default
	// policy (none: root alone may act).
	guard, err := control.NewGuard(&control.AccessPolicy{}, control.GuardOptions{
		Service:  phasegatev1.Slots_ServiceDesc.ServiceName,
		Mutating: phasegatev1.SlotsMutatingMethods(),
		Surface:  "socket",
		Logger:   log.With("audit", true),
	})
	if err != nil {
		return fmt.Errorf("control guard: %w", err)
	}
	sc := server.DefaultConfig()
	sc.Listener, sc.DrainDelay, sc.StopTimeout = l, 20*time.Millisecond, 5*time.Second
	sc.GRPCOptions = []grpc.ServerOption{grpc.ChainUnaryInterceptor(guard.Intercept)}
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
	if err := srv.Bind(phasegatev1.Slots_ServiceDesc.ServiceName, phases.NewSlotsServer(mgr, pl, newMemStore(), log)); err != nil {
		return err
	}
	if err := pl.WaitReady(ctx, poolSize); err != nil {
		return fmt.Errorf("wait for %d warm slots: %w", poolSize, err)
	}
	log.Info(msgPoolReady, "warm", poolSize)
	<-ctx.Done()
	return nil
}

// memStore is a phases.LeaseStore in memory: the records in a map, and
// the leased ones' requests in another, under one mutex. It keeps the
// contracts the Slots service relies on, as *leases.Store does, so that
// the service behaves the same over either. It does not validate records
// (the service makes only valid ones) and writes nothing anywhere.
type memStore struct {
	mu       sync.Mutex
	recs     map[int]leases.Record
	requests map[memRequest]int // a leased record's (owner, request id) -> its index
}

type memRequest struct{ owner, requestID string }

func newMemStore() *memStore {
	return &memStore{recs: map[int]leases.Record{}, requests: map[memRequest]int{}}
}

var _ phases.LeaseStore = (*memStore)(nil)

// requestOf is the request a record holds, as the store indexes it: only
// a leased record with a request id holds one.
func requestOf(r leases.Record) (memRequest, bool) {
	if r.State != leases.Leased || r.RequestID == "" {
		return memRequest{}, false
	}
	return memRequest{r.Owner, r.RequestID}, true
}

// Put records recs, all or none, refusing a request that another slot's
// record holds with *leases.DuplicateRequestError.
func (m *memStore) Put(ctx context.Context, recs ...leases.Record) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range recs {
		if rq, ok := requestOf(r); ok {
			if i, held := m.requests[rq]; held && i != r.Index {
				return &leases.DuplicateRequestError{Owner: r.Owner, RequestID: r.RequestID, Index: i}
			}
		}
	}
	for _, r := range recs {
		m.set(r.Index, r)
	}
	return nil
}

// Delete deletes the records of indices; those with none are ignored.
func (m *memStore) Delete(ctx context.Context, indices ...int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, i := range indices {
		m.remove(i)
	}
	return nil
}

// remove deletes the record of index i and the request it holds. Call
// with m.mu held.
func (m *memStore) remove(i int) {
	if old, ok := m.recs[i]; ok {
		if rq, ok := requestOf(old); ok {
			delete(m.requests, rq)
		}
		delete(m.recs, i)
	}
}

// set replaces the record of index i, keeping the request index right.
// Call with m.mu held.
func (m *memStore) set(i int, r leases.Record) {
	m.remove(i)
	m.recs[i] = r
	if rq, ok := requestOf(r); ok {
		m.requests[rq] = i
	}
}

// Update lets fn change the record of index i (leases.ErrNotFound if it
// has none; leases.ErrRemove from fn deletes it) and returns it as kept.
func (m *memStore) Update(ctx context.Context, i int, fn func(*leases.Record) error) (leases.Record, error) {
	if err := ctx.Err(); err != nil {
		return leases.Record{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	old, ok := m.recs[i]
	if !ok {
		return leases.Record{}, fmt.Errorf("%w for slot %d", leases.ErrNotFound, i)
	}
	r := old
	switch err := fn(&r); {
	case errors.Is(err, leases.ErrRemove):
		m.remove(i)
		return leases.Record{}, nil
	case err != nil:
		return leases.Record{}, err
	}
	if rq, ok := requestOf(r); ok {
		if j, held := m.requests[rq]; held && j != i {
			return leases.Record{}, &leases.DuplicateRequestError{Owner: r.Owner, RequestID: r.RequestID, Index: j}
		}
	}
	m.set(i, r)
	return r, nil
}
