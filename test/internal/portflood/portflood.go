// Package portflood is a client that floods a server's port the way a
// local user starved the daemon through it: as many gRPC connections as it
// can get, one call each, held; TCP connections that never send a byte; big
// unauthenticated calls in flight; and, before the port knows a
// connection's protocol, HTTP/2 frames no client sends first (h2.go). The
// end-to-end tests run it as another user (the test binary re-executed
// under runuser), and so does the benchmark's flood part. Traffic goes
// only where it is told.
package portflood

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// Run runs the flood spec names, "MODE|ADDR|N|SECONDS" with MODE grpc,
// hold, silent or bigacquire (see GRPC, Hold, Silent, BigAcquire), or one of the
// floods of the port's first bytes (h2data, h2header, stall, noread: see
// H2; ADDR tls://host:port for them over TLS): it writes "ready"
// to stdout after its first round and its Report as JSON when the time is
// up, and returns the exit code.
func Run(spec string, stdout, stderr io.Writer) int {
	parts := strings.Split(spec, "|")
	if len(parts) != 4 {
		fmt.Fprintf(stderr, "portflood %q: want MODE|ADDR|N|SECONDS\n", spec)
		return 2
	}
	n, err1 := strconv.Atoi(parts[2])
	secs, err2 := strconv.Atoi(parts[3])
	flood := map[string]func(string, int, time.Time, func()) Report{"grpc": GRPC, "hold": Hold, "silent": Silent, "bigacquire": BigAcquire}[parts[0]]
	if h2, ok := h2FloodNamed(parts[0]); ok {
		flood = func(addr string, n int, until time.Time, ready func()) Report { return H2(h2, addr, n, until, ready) }
	}
	if err1 != nil || err2 != nil || flood == nil {
		fmt.Fprintf(stderr, "portflood %q: want MODE (grpc, hold, silent, bigacquire, h2data, h2header, stall, noread)|ADDR|N|SECONDS\n", spec)
		return 2
	}
	rep := flood(parts[1], n, time.Now().Add(time.Duration(secs)*time.Second), func() { fmt.Fprintln(stdout, "ready") })
	b, _ := json.Marshal(rep)
	fmt.Fprintln(stdout, string(b))
	return 0
}

// Report is what the flooding client saw.
type Report struct {
	// Held is the most connections held at once: answered a call (grpc),
	// or open for a second (silent).
	Held int `json:"held"`
	// Attempts and Refused count connections tried, and those the server
	// closed without serving them.
	Attempts int `json:"attempts"`
	Refused  int `json:"refused"`
	// Codes counts how the big Acquires ended.
	Codes map[string]int `json:"codes,omitempty"`
	// Sent is what the floods of the first bytes wrote that the kernel
	// took, in bytes; Longest the longest one of their connections lived
	// before the server ended it, in seconds.
	Sent    int64   `json:"sent,omitempty"`
	Longest float64 `json:"longest_s,omitempty"`
}

// inParallel runs f(i) for i in [0, n) on 64 goroutines.
func inParallel(n int, f func(i int)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, 64) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(n); i = next.Add(1) - 1 {
				f(int(i))
			}
		})
	}
	wg.Wait()
}

// GRPC tops up to n connections that answered a call, once a second,
// and holds them until until: a health Check on TCP, a Slots List on a
// Unix socket (unix:///path). ready is called after the first round.
func GRPC(addr string, n int, until time.Time, ready func()) Report {
	return hold(addr, n, until, ready, func(err error) bool { return err == nil })
}

// Hold is GRPC that holds a connection whatever its call's answer, as
// long as the server answered it: a caller the server lets connect and
// refuses every call (PermissionDenied) still holds a connection of it.
func Hold(addr string, n int, until time.Time, ready func()) Report {
	return hold(addr, n, until, ready, func(err error) bool {
		switch status.Code(err) {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			return false // not answered: no connection, or not served
		}
		return true
	})
}

// hold tops up to n connections whose call's error answered says is
// served, once a second, and holds them until until.
func hold(addr string, n int, until time.Time, ready func(), answered func(error) bool) Report {
	var (
		mu   sync.Mutex
		held []*grpc.ClientConn
		rep  Report
	)
	for round := 0; time.Now().Before(until); round++ {
		mu.Lock()
		need := n - len(held)
		mu.Unlock()
		inParallel(need, func(int) {
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			if strings.HasPrefix(addr, "unix://") {
				_, err = phasegatev1.NewSlotsClient(conn).List(ctx, &phasegatev1.ListRequest{})
			} else {
				_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			}
			cancel()
			mu.Lock()
			defer mu.Unlock()
			rep.Attempts++
			if !answered(err) {
				rep.Refused++
				conn.Close()
				return
			}
			held = append(held, conn)
			rep.Held = max(rep.Held, len(held))
		})
		if round == 0 {
			ready()
		}
		time.Sleep(time.Second)
	}
	for _, c := range held {
		c.Close()
	}
	return rep
}

// Silent keeps n TCP connections open that never send a byte, redialling
// those the server closes, every 200 ms, until until. ready is called
// after the first round.
func Silent(addr string, n int, until time.Time, ready func()) Report {
	var (
		mu   sync.Mutex
		open = map[net.Conn]time.Time{}
		rep  Report
	)
	for round := 0; time.Now().Before(until); round++ {
		mu.Lock()
		need := n - len(open)
		mu.Unlock()
		inParallel(need, func(int) {
			c, err := net.DialTimeout("tcp", addr, 2*time.Second)
			mu.Lock()
			rep.Attempts++
			if err != nil {
				rep.Refused++
				mu.Unlock()
				return
			}
			at := time.Now()
			open[c] = at
			mu.Unlock()
			go func() {
				_, _ = c.Read(make([]byte, 1)) // returns when the server closes it
				c.Close()
				mu.Lock()
				defer mu.Unlock()
				delete(open, c)
				if time.Since(at) < 100*time.Millisecond {
					rep.Refused++
				}
			}()
		})
		mu.Lock()
		aged := 0
		for _, at := range open {
			if time.Since(at) >= time.Second {
				aged++
			}
		}
		rep.Held = max(rep.Held, aged)
		mu.Unlock()
		if round == 0 {
			ready()
		}
		time.Sleep(200 * time.Millisecond)
	}
	mu.Lock()
	for c := range open {
		c.Close()
	}
	mu.Unlock()
	return rep
}

// rawCodec sends bytes already encoded, so that a thousand calls of 4 MiB
// share one buffer on the client's side. It is registered as "proto", in
// the flooding process only: a codec of another name would send
// content-type application/grpc+proto, which the port does not take for
// gRPC.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error)      { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error { return nil }
func (rawCodec) Name() string                       { return "proto" }

var _ encoding.Codec = rawCodec{}

// BigAcquire keeps n Slots Acquire calls of 4 MiB (within grpc-go's
// default bound) in flight, without credentials, 4 on each connection,
// until until. ready is called once the connections are made.
func BigAcquire(addr string, n int, until time.Time, ready func()) Report {
	msg, _ := proto.Marshal(&phasegatev1.AcquireRequest{Owner: strings.Repeat("x", 4<<20-64)})
	encoding.RegisterCodec(rawCodec{})
	rep := Report{Codes: map[string]int{}}
	var mu sync.Mutex
	conns := make([]*grpc.ClientConn, (n+3)/4)
	for i := range conns {
		conns[i], _ = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	ready()
	inParallel(n, func(i int) {
		for time.Now().Before(until) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			err := conns[i/4].Invoke(ctx, "/phasegate.v1.Slots/Acquire", &msg, new([]byte))
			cancel()
			mu.Lock()
			rep.Attempts++
			rep.Codes[status.Code(err).String()]++
			mu.Unlock()
		}
	})
	for _, c := range conns {
		c.Close()
	}
	return rep
}
