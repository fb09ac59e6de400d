package test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// The flooding client of security_flood_test.go: this test binary, run
// as another user.

// portFloodEnv makes this test binary, run as another user, a client that
// floods a port: "MODE|ADDR|N|SECONDS" with MODE grpc (as many connections
// as it can, one call each, held: a health Check on TCP, a List on a Unix
// socket, unix:///path), silent (TCP connections that
// never send a byte, redialled when closed) or bigacquire (Acquire calls of
// 4 MiB, N at once over as many connections as it gets, one after another).
// It prints "ready" once its first round is done, and its report as JSON
// when the time is up.
const portFloodEnv = "PHASEGATE_TEST_PORT_FLOOD"

func init() {
	if v := os.Getenv(portFloodEnv); v != "" {
		os.Exit(portFlood(v))
	}
}

// floodReport is what the flooding client saw.
type floodReport struct {
	// Held is the most connections held at once: answered a call (grpc),
	// or open for a second (silent).
	Held int `json:"held"`
	// Attempts and Refused count connections tried, and those the server
	// closed without serving them.
	Attempts int `json:"attempts"`
	Refused  int `json:"refused"`
	// Codes counts how the big Acquires ended.
	Codes map[string]int `json:"codes,omitempty"`
}

func portFlood(spec string) int {
	parts := strings.Split(spec, "|")
	n, err1 := strconv.Atoi(parts[min(2, len(parts)-1)])
	secs, err2 := strconv.Atoi(parts[min(3, len(parts)-1)])
	if len(parts) != 4 || err1 != nil || err2 != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want MODE|ADDR|N|SECONDS\n", portFloodEnv, spec)
		return 2
	}
	until := time.Now().Add(time.Duration(secs) * time.Second)
	var rep floodReport
	switch parts[0] {
	case "grpc":
		rep = floodGRPC(parts[1], n, until)
	case "silent":
		rep = floodSilent(parts[1], n, until)
	case "bigacquire":
		rep = floodBigAcquire(parts[1], n, until)
	default:
		fmt.Fprintf(os.Stderr, "%s: unknown mode %q\n", portFloodEnv, parts[0])
		return 2
	}
	b, _ := json.Marshal(rep)
	fmt.Println(string(b))
	return 0
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

// floodGRPC tops up to n connections that answered a call, once a
// second, and holds them.
func floodGRPC(addr string, n int, until time.Time) floodReport {
	var (
		mu   sync.Mutex
		held []*grpc.ClientConn
		rep  floodReport
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
			if err != nil {
				rep.Refused++
				conn.Close()
				return
			}
			held = append(held, conn)
			rep.Held = max(rep.Held, len(held))
		})
		if round == 0 {
			fmt.Println("ready")
		}
		time.Sleep(time.Second)
	}
	for _, c := range held {
		c.Close()
	}
	return rep
}

// floodSilent keeps n TCP connections open that never send a byte,
// redialling those the server closes, every 200 ms.
func floodSilent(addr string, n int, until time.Time) floodReport {
	var (
		mu   sync.Mutex
		open = map[net.Conn]time.Time{}
		rep  floodReport
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
			fmt.Println("ready")
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

// floodBigAcquire keeps n Acquire calls of 4 MiB in flight, without
// credentials, over as many connections as the port lets it hold (4
// calls on each).
func floodBigAcquire(addr string, n int, until time.Time) floodReport {
	msg, _ := proto.Marshal(&phasegatev1.AcquireRequest{Owner: strings.Repeat("x", 4<<20-64)}) // within grpc-go's default bound
	encoding.RegisterCodec(rawCodec{})
	rep := floodReport{Codes: map[string]int{}}
	var mu sync.Mutex
	conns := make([]*grpc.ClientConn, (n+3)/4)
	for i := range conns {
		conns[i], _ = grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	}
	fmt.Println("ready")
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

// portFlood runs the flooding client as nobody against addr until it is
// ready, and returns a function that waits for its report.
func (p *publicDir) portFlood(t *testing.T, mode, addr string, n int, d time.Duration) (wait func() floodReport) {
	t.Helper()
	cmd := exec.Command("runuser", "-u", "nobody", "--", p.testBinary)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|%d|%d", portFloodEnv, mode, addr, n, int(d.Seconds())))
	cmd.Dir, cmd.Stderr = p.dir, os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	r := bufio.NewReader(out)
	if line, err := r.ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("the %s flood as nobody: %q %v", mode, line, err)
	}
	return func() floodReport {
		t.Helper()
		line, err := r.ReadString('\n')
		var rep floodReport
		if err != nil || json.Unmarshal([]byte(line), &rep) != nil {
			t.Fatalf("the %s flood's report: %q %v", mode, line, err)
		}
		if err := cmd.Wait(); err != nil {
			t.Fatalf("the %s flood: %v", mode, err)
		}
		return rep
	}
}
