package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/phasetest"
	"github.com/phasegate/phasegate/phasetest/proc"
)

// wait bounds every wait for a condition: they hold within milliseconds;
// the bound only keeps a broken test from hanging.
// bins are the binaries the tests run, built once and removed at the end.
var bins proc.Builds

func TestMain(m *testing.M) { os.Exit(bins.Main(m)) }

const wait = time.Minute

// In process: the worker waits for the queue, then consumes, then serves.
func TestStartupOrder(t *testing.T) {
	q := startQueue(t, 0)
	a := startWorker(t, q.url)
	phasetest.AssertOrder(t, a.Lifecycle().Events(0), "queue", "consume", "serve")
	phasetest.AssertRespectsDependencies(t, a.Lifecycle().Events(0))
}

// Black-box: the built binary, its order read from its event stream.
func TestStartupOrderOfTheProcess(t *testing.T) {
	q := startQueue(t, 0)
	p := proc.Start(t, bins.Build(t, "."), proc.Args("-listen", "127.0.0.1:0", "-queue", q.url))
	s := p.Follow()
	phasetest.WaitState(t, s, lifecycle.StateServing, wait)
	phasetest.AssertOrder(t, s.Events(0), "queue", "consume", "serve")
}

// The queue comes up after the worker: the worker retries, its health says
// it waits in phase queue and for what, it serves only once the queue
// answers, then processes every job and reports it; SIGTERM stops it with
// exit 0.
func TestProcessWaitsForTheQueue(t *testing.T) {
	addr, listen := reservePort(t)
	queueURL := "http://" + addr
	p := proc.Start(t, bins.Build(t, "."), proc.Args("-listen", "127.0.0.1:0", "-queue", queueURL))
	workerAddr := p.Addr()

	// Each stage in a subtest of its own, so that a failure names it.
	t.Run("waits", func(t *testing.T) {
		s := phasetest.Follow(t, "http://"+workerAddr+app.PathEvents)
		phasetest.WaitPhase(t, s, "queue", lifecycle.PhaseRetrying, wait)
		for _, e := range s.Events(0) {
			if e.Kind == lifecycle.EventLifecycle && e.To == lifecycle.StateServing {
				t.Fatalf("serving before the queue exists: %v", e)
			}
		}
	})
	want := "starting: phase queue "
	eventually(t, "health naming the phase and what it waits for", func() bool {
		code, body := get(t, workerAddr, "/health")
		return code == http.StatusServiceUnavailable && strings.Contains(body, want) && strings.Contains(body, "waiting for "+queueURL)
	})
	if code, body := get(t, workerAddr, "/v1/stats"); code != http.StatusServiceUnavailable || !strings.Contains(body, want) {
		t.Errorf("the stats route while waiting: %d %s", code, body)
	}

	const jobs = 25
	q := serveQueue(t, listen(), jobs)
	t.Run("serves after the queue", func(t *testing.T) {
		s := phasetest.Follow(t, "http://"+workerAddr+app.PathEvents)
		phasetest.WaitState(t, s, lifecycle.StateServing, wait)
		phasetest.AssertOrder(t, s.Events(0), "queue", "consume", "serve")
		if q.healthChecks.Load() == 0 {
			t.Error("the worker serves, but never reached the queue")
		}
	})
	q.waitResults(t, jobs)
	eventually(t, "stats counting every job", func() bool {
		code, body := get(t, workerAddr, "/v1/stats")
		return code == http.StatusOK && strings.Contains(body, fmt.Sprintf(`"processed":%d`, jobs))
	})

	p.Signal(syscall.SIGTERM)
	if code := p.Wait(wait); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if out := p.Output(); !strings.Contains(out, `msg="phase retrying" phase=queue`) || !strings.Contains(out, "msg=lifecycle state=stopped from=draining") {
		t.Errorf("the log lacks the retries or the stop:\n%s", out)
	}
}

// A queue lost after the start leaves the worker serving, with a warning
// in its health, until the queue is back.
func TestWarnsWhileTheQueueIsGone(t *testing.T) {
	q := startQueue(t, 3)
	a := startWorker(t, q.url)
	addr := a.Addr(context.Background()).String()
	q.waitResults(t, 3)

	q.close()
	// The first warning may be the last result's, cut off by the close
	// after the queue counted it ("result not recorded"); the next poll
	// replaces it with the one this test is about.
	phasetest.WaitSnapshot(t, a.Lifecycle(), "the queue warning", wait, func(s lifecycle.Snapshot) bool {
		return len(s.Warnings) == 1 && strings.HasPrefix(s.Warnings[0].Message, "cannot reach ")
	})
	code, body := get(t, addr, "/health")
	if code != http.StatusOK || !strings.Contains(body, `"status":"warn"`) || !strings.Contains(body, "serving; 1 warning: queue: cannot reach "+q.url) {
		t.Errorf("/health without the queue: %d %s", code, body)
	}

	l, err := net.Listen("tcp", strings.TrimPrefix(q.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	q2 := serveQueue(t, l, 2)
	q2.waitResults(t, 2)
	phasetest.WaitSnapshot(t, a.Lifecycle(), "the warning cleared", wait, func(s lifecycle.Snapshot) bool { return len(s.Warnings) == 0 })
}

// A stop while a job is in hand lets the job finish and its result be
// recorded before the worker stops.
func TestStopFinishesTheJobInHand(t *testing.T) {
	q := startQueue(t, 1)
	inHand, release := make(chan struct{}), make(chan struct{})
	q.mu.Lock()
	q.beforeResult = func() {
		close(inHand)
		<-release
	}
	q.mu.Unlock()
	a := startWorker(t, q.url)
	<-inHand
	stopped := make(chan error, 1)
	go func() { stopped <- a.Stop(context.Background()) }()
	phasetest.WaitSnapshot(t, a.Lifecycle(), "the drain", wait, func(s lifecycle.Snapshot) bool { return s.State == lifecycle.StateDraining })
	close(release)
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	q.waitResults(t, 1)
}

// startWorker starts a worker in process and stops it when the test ends.
func startWorker(t *testing.T, queue string) *app.App {
	t.Helper()
	cfg := app.DefaultConfig("worker", "127.0.0.1:0")
	cfg.DrainDelay = 0
	a, err := newWorker(cfg, queue)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := a.Stop(context.Background()); err != nil {
			t.Errorf("stop: %v", err)
		}
	})
	if err := a.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	return a
}

// queue is a job queue speaking the protocol of queue.go on loopback,
// checking each result it gets.
type queue struct {
	t            *testing.T
	url          string
	srv          *http.Server
	healthChecks atomic.Int64

	mu      sync.Mutex
	pending []Job
	want    map[string]Result
	got     map[string]Result
	wake    chan struct{} // closed at each result

	// beforeResult, when set, runs as the first result arrives, before
	// it is recorded.
	beforeResult func()
}

// startQueue serves a queue of n jobs on a new loopback port.
func startQueue(t *testing.T, n int) *queue {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveQueue(t, l, n)
}

// serveQueue serves a queue of n jobs on l until the test ends.
func serveQueue(t *testing.T, l net.Listener, n int) *queue {
	q := &queue{t: t, url: "http://" + l.Addr().String(), want: map[string]Result{}, got: map[string]Result{}, wake: make(chan struct{})}
	for i := range n {
		text := strings.Repeat("word ", i+1)
		sum := sha256.Sum256([]byte(text))
		j := Job{ID: fmt.Sprintf("job-%d", i), Text: text}
		q.pending = append(q.pending, j)
		q.want[j.ID] = Result{Words: i + 1, SHA256: hex.EncodeToString(sum[:])}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(http.ResponseWriter, *http.Request) { q.healthChecks.Add(1) })
	mux.HandleFunc("GET /jobs/next", q.next)
	mux.HandleFunc("POST /jobs/{id}/result", q.result)
	q.srv = &http.Server{Handler: mux}
	go func() { _ = q.srv.Serve(l) }()
	t.Cleanup(q.close)
	return q
}

func (q *queue) close() { _ = q.srv.Close() }

func (q *queue) next(w http.ResponseWriter, _ *http.Request) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.pending) == 0 {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	j := q.pending[0]
	q.pending = q.pending[1:]
	_ = json.NewEncoder(w).Encode(j)
}

func (q *queue) result(w http.ResponseWriter, r *http.Request) {
	var res Result
	b, _ := io.ReadAll(r.Body)
	if err := json.Unmarshal(b, &res); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := r.PathValue("id")
	q.mu.Lock()
	f := q.beforeResult
	q.beforeResult = nil
	q.mu.Unlock()
	if f != nil {
		f()
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if want, ok := q.want[id]; !ok || res != want {
		q.t.Errorf("result of %s: %+v, want %+v", id, res, want)
	}
	if _, dup := q.got[id]; dup {
		q.t.Errorf("result of %s reported twice", id)
	}
	q.got[id] = res
	close(q.wake)
	q.wake = make(chan struct{})
	w.WriteHeader(http.StatusNoContent)
}

// waitResults waits until n results are in.
func (q *queue) waitResults(t *testing.T, n int) {
	t.Helper()
	timeout := time.After(wait)
	for {
		q.mu.Lock()
		got, wake := len(q.got), q.wake
		q.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-wake:
		case <-timeout:
			t.Fatalf("%d of %d results within %s", got, n, wait)
		}
	}
}

// reservePort binds a loopback port without listening on it: connections
// to it are refused until listen is called, and no other program can take
// the port meanwhile. So a test can name its dependency's address before
// the dependency exists.
func reservePort(t *testing.T) (addr string, listen func() net.Listener) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "reserved")
	t.Cleanup(func() { f.Close() })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	addr = fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	return addr, func() net.Listener {
		if err := syscall.Listen(fd, 128); err != nil {
			t.Fatal(err)
		}
		l, err := net.FileListener(f) // its own descriptor
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
}

// eventually polls cond until it holds, for what only an outside client
// can see.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, wait)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: wait}
	defer c.CloseIdleConnections()
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, string(b)
}
