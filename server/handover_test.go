package server_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/phasegate/phasegate/server"
)

// A drain for a handover stops the port without refusing or dropping a
// single connection: those the server took are answered, those still in
// the backlog wait for the next holder of the socket. Clients connect
// without pause the whole time; the new holder is a plain HTTP server on
// the duplicated descriptor, as a new image of the process would be.
func TestDrainForHandoverDropsNoConnection(t *testing.T) {
	cfg := server.DefaultConfig()
	cfg.Addr = "127.0.0.1:0"
	cfg.DrainDelay = 0
	cfg.StopTimeout = 5 * time.Second
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Handle("GET /who", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "old")
	})); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()

	var who whoClients
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() { who.ask(addr, stop) })
	}
	waitUntil(t, "answers from the old server", func() bool { return who.old.Load() > 50 })

	f, err := srv.ListenerFile()
	if err != nil {
		t.Fatal(err)
	}
	srv.DrainForHandover()
	if err := srv.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The old server is gone; the connections that came meanwhile are in
	// the backlog. A pause, as an exec and a start take.
	time.Sleep(200 * time.Millisecond)
	l, err := net.FileListener(f)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	next := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "new") })}
	go func() { _ = next.Serve(l) }()
	waitUntil(t, "answers from the new server", func() bool { return who.neu.Load() > 50 })
	close(stop)
	wg.Wait()
	_ = next.Shutdown(context.Background())

	t.Logf("%d answered by the old server, %d by the new one, %d failed", who.old.Load(), who.neu.Load(), who.failed.Load())
	if who.failed.Load() != 0 {
		t.Fatalf("%d requests failed across the handover; first: %v", who.failed.Load(), who.firstErr.Load())
	}
}

// whoClients counts the answers to clients asking /who without pause: the
// old server's, the new one's, and the failures with the first of them.
type whoClients struct {
	old, neu, failed atomic.Int64
	firstErr         atomic.Value
}

// ask asks addr's /who on a new connection each time until stop closes.
func (w *whoClients) ask(addr string, stop <-chan struct{}) {
	c := http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		select {
		case <-stop:
			return
		default:
		}
		resp, err := c.Get("http://" + addr + "/who")
		if err != nil {
			w.failed.Add(1)
			w.firstErr.CompareAndSwap(nil, err)
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch string(b) {
		case "old":
			w.old.Add(1)
		case "new":
			w.neu.Add(1)
		default:
			w.failed.Add(1)
			w.firstErr.CompareAndSwap(nil, fmt.Errorf("answer %d %q", resp.StatusCode, b))
		}
	}
}
