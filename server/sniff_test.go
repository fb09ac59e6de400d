package server

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/phasegate/phasegate/health"
	"github.com/phasegate/phasegate/internal/testcerts"
	"github.com/phasegate/phasegate/lifecycle"
)

// frame is an HTTP/2 frame as a client writes it, its header saying
// length, whatever the payload given.
func frame(typ http2.FrameType, flags http2.Flags, stream uint32, length int, payload []byte) []byte {
	b := []byte{byte(length >> 16), byte(length >> 8), byte(length), byte(typ), byte(flags),
		byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}
	return append(b, payload...)
}

// h2 is a client's connection preface and SETTINGS frame, then frames.
func h2(frames ...[]byte) []byte {
	b := append([]byte(http2.ClientPreface), frame(http2.FrameSettings, 0, 0, 6, []byte{0, 3, 0, 0, 0, 100})...)
	return append(b, bytes.Join(frames, nil)...)
}

// headerBlock is an HPACK block of a request with those fields.
func hpackBlock(fields ...string) []byte {
	var b bytes.Buffer
	enc := hpack.NewEncoder(&b)
	for i := 0; i+1 < len(fields); i += 2 {
		_ = enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return b.Bytes()
}

var grpcRequest = hpackBlock(":method", "POST", ":scheme", "http", ":path", "/grpc.health.v1.Health/Check",
	":authority", "t", "content-type", "application/grpc", "te", "trailers")

// sniffServer is a server with health (of a lifecycle not started: it
// answers NOT_SERVING, and /livez 200) on loopback, with the given sniff timeout and TLS configuration.
func sniffServer(t *testing.T, lim Limits, sniff time.Duration, tc *tls.Config) *Server {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skip("linux only")
	}
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "x", Run: func(context.Context, *lifecycle.Progress) error { return nil }}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Addr, cfg.Limits, cfg.SniffTimeout, cfg.DrainDelay, cfg.StopTimeout = "127.0.0.1:0", lim, sniff, 0, time.Second
	cfg.Health, cfg.TLS = health.New(lc, health.Options{}), tc
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Handle("GET /ok", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })); err != nil {
		t.Fatal(err)
	}
	if err := s.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Drain(context.Background()) })
	return s
}

// attack writes b on a new connection (over TLS when tc is set) without
// reading, and reports how long the server took to end the connection.
func attack(t *testing.T, s *Server, tc *tls.Config, b []byte) time.Duration {
	t.Helper()
	raw, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	var c net.Conn = raw
	start := time.Now()
	if tc != nil {
		tlc := tls.Client(raw, tc)
		if err := tlc.Handshake(); err != nil {
			t.Fatalf("handshake: %v", err)
		}
		c = tlc
	}
	go func() { _, _ = c.Write(b) }() // blocks once the server stops reading
	_ = c.SetReadDeadline(time.Now().Add(wait))
	for {
		if _, err := c.Read(make([]byte, 4096)); err != nil {
			if isTimeoutErr(err) {
				t.Fatalf("the server never closed the connection: %v", err)
			}
			return time.Since(start)
		}
	}
}

// Frames no gRPC or HTTP/2 client sends before its first request, frames
// larger than HTTP/2's initial size, and more than MaxSniffBytes of frames
// it does send, are refused as soon as they are read: the connection is
// closed long before the sniff timeout, counted, and no server gets it.
// Over TLS alike, where the client has no certificate.
func TestSniffRefusesWhatNoClientSendsFirst(t *testing.T) {
	certs, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	ping := frame(http2.FramePing, 0, 0, 8, make([]byte, 8))
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"DATA of 16 MiB", h2(frame(http2.FrameData, 0, 1, 1<<24-1, make([]byte, 1<<20)))},
		{"the header of a 16 MiB frame alone", h2(frame(http2.FrameHeaders, 0, 1, 1<<24-1, nil))},
		{"DATA of 1 KiB", h2(frame(http2.FrameData, 0, 1, 1024, make([]byte, 1024)))},
		{"DATA before SETTINGS", append([]byte(http2.ClientPreface), frame(http2.FrameData, 0, 1, 16, make([]byte, 16))...)},
		{"HEADERS of 17 KiB", h2(frame(http2.FrameHeaders, 0, 1, 17<<10, make([]byte, 17<<10)))},
		{"RST_STREAM", h2(frame(http2.FrameRSTStream, 0, 1, 4, make([]byte, 4)))},
		{"GOAWAY", h2(frame(http2.FrameGoAway, 0, 0, 8, make([]byte, 8)))},
		{"CONTINUATION without HEADERS", h2(frame(http2.FrameContinuation, 0x4, 1, 8, make([]byte, 8)))},
		{"HEADERS on a server's stream", h2(frame(http2.FrameHeaders, 0x4, 2, len(grpcRequest), grpcRequest))},
		{"an unknown frame type", h2(frame(0xbb, 0, 0, 8, make([]byte, 8)))},
		{"PINGs past MaxSniffBytes", h2(bytes.Repeat(ping, DefaultMaxSniffBytes/len(ping)+1))},
		{"a header block that does not decode", h2(frame(http2.FrameHeaders, 0x4, 1, 4, []byte{0xff, 0xff, 0xff, 0xff}))},
	} {
		for _, overTLS := range []bool{false, true} {
			name := tc.name
			var srvTLS, cliTLS *tls.Config
			if overTLS {
				name += " over TLS"
				srvTLS = &tls.Config{Certificates: []tls.Certificate{certs.Server}, ClientCAs: certs.CAPool}
				cliTLS = &tls.Config{RootCAs: certs.CAPool, ServerName: "127.0.0.1", NextProtos: []string{"h2"}}
			}
			t.Run(name, func(t *testing.T) {
				s := sniffServer(t, DefaultLimits(), 10*time.Second, srvTLS)
				took := attack(t, s, cliTLS, tc.b)
				if took > 2*time.Second {
					t.Errorf("the connection ended after %v; the sniff timeout is 10s", took)
				}
				waitFor(t, "the refusal counted and the connection closed", func() bool {
					st := s.ConnStats()
					return st.RefusedProtocol == 1 && st.Open == 0 && st.Sniffing == 0
				})
			})
		}
	}
}

// waitFor is waitUntil of package server_test, for this package's tests.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(wait)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// wait bounds a wait on a condition met in milliseconds.
const wait = 10 * time.Second

// A client that never reads and sends SETTINGS frames one after another,
// each of which cmux answered with a write of its own that had no
// deadline, is closed at the sniff timeout all the same: the port writes
// its preface once, and the deadline covers writes.
func TestSniffDeadlineCoversTheWholeDecision(t *testing.T) {
	s := sniffServer(t, Limits{}, 500*time.Millisecond, nil)
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.(*net.TCPConn).SetReadBuffer(2048) // the server's writes back up soon
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		settings := frame(http2.FrameSettings, 0, 0, 0, nil)
		_, _ = c.Write([]byte(http2.ClientPreface))
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			if _, err := c.Write(bytes.Repeat(settings, 512)); err != nil && !isTimeoutErr(err) {
				return
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()
	start := time.Now()
	waitFor(t, "the connection closed", func() bool { return s.ConnStats().Open == 0 && time.Since(start) > 10*time.Millisecond })
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a client that never reads kept its connection %v; the sniff timeout is 500ms", took)
	}
}

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Connections being sniffed are bounded apart from the others: an
// unprivileged peer gets MaxSniffingPerPeer of them, unprivileged peers
// together MaxSniffing, and the rest is closed at accept. Root's are not
// counted: its silent connections are kept past the bound, and its
// requests are served beside the flood. Silent connections give their
// share back at the sniff timeout.
func TestSniffingBoundedInTotal(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the peers are sockets made as other users")
	}
	const nobody, nogroup, other = 65534, 65533, 65532
	lim := Limits{MaxSniffing: 8, MaxSniffingPerPeer: 4}
	s := sniffServer(t, lim, 3*time.Second, nil)
	addr := s.Addr().String()
	silent := func(uid int) net.Conn {
		c := dialFrom(t, uid, "", addr)
		t.Cleanup(func() { c.Close() })
		return c
	}
	for range 4 {
		silent(nobody)
	}
	waitFor(t, "nobody's 4 sniffing", func() bool { return s.ConnStats().Sniffing == 4 })
	if c := silent(nobody); !closedByServer(c) {
		t.Error("nobody's fifth connection being sniffed was taken, its bound is 4")
	}
	for range 4 {
		silent(nogroup)
	}
	waitFor(t, "8 sniffing", func() bool { return s.ConnStats().Sniffing == 8 })
	if c := silent(other); !closedByServer(c) {
		t.Error("a ninth unprivileged connection being sniffed was taken; the bound is 8")
	}
	for range 10 {
		silent(0)
	}
	for i := range 3 {
		if h := open(t, s, 0, ""); h.err != nil {
			t.Fatalf("root's request %d beside the sniffing flood: %v", i, h.err)
		}
	}
	// 8 unprivileged, root's 10 silent and 3 served.
	if st := s.ConnStats(); st.Open != 21 || st.RefusedSniffing != 2 || st.Sniffing != 8 || st.ImpairedNow || !st.Impaired.IsZero() {
		t.Errorf("ConnStats = %+v, want 21 open, 2 refused over the sniffing bound, 8 being sniffed, not impaired", st)
	}
	// Root's three requests' connections are kept alive; every silent
	// one, root's included, is closed at the sniff timeout.
	waitFor(t, "the silent connections closed at the sniff timeout", func() bool {
		st := s.ConnStats()
		return st.Open == 3 && st.Sniffing == 0
	})
	for range 4 {
		if h := open(t, s, nobody, ""); h.err != nil {
			t.Fatalf("nobody after the flood: %v", h.err)
		}
	}
}

// closedByServer reports whether the server ends c (a reset or end of
// file) within a second.
func closedByServer(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := c.Read(make([]byte, 1))
	return err != nil && !isTimeoutErr(err)
}

// What a flood of the port's first bytes can make the process hold is
// bounded by MaxSniffing connections of MaxSniffBytes each, however many
// it opens and whatever they send: 8 users' 16 connections each that stall
// just under MaxSniffBytes (the bound, filled), then 64 connections that
// each send a preface and the header of a 16 MiB frame and 64 that send
// DATA frames of 16 MiB, while they are all open. cmux read such frames
// whole into memory: the header kind alone took 1 GiB.
func TestSniffHoldsBoundedMemory(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the peers are sockets made as other users")
	}
	s := sniffServer(t, DefaultLimits(), 10*time.Second, nil)
	ping := frame(http2.FramePing, 0, 0, 8, make([]byte, 8))
	base := heapInUse()
	var conns []net.Conn
	var wg sync.WaitGroup
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
	}()
	flood := func(uid, n int, b []byte) {
		for range n {
			c := dialFrom(t, uid, "", s.Addr().String())
			conns = append(conns, c)
			wg.Go(func() { _, _ = c.Write(b) })
		}
	}
	stall := h2(bytes.Repeat(ping, (DefaultMaxSniffBytes-200)/len(ping)))
	for uid := 60000; uid < 60008; uid++ {
		flood(uid, DefaultMaxSniffingPerPeer, stall)
	}
	waitFor(t, "the stalling connections sniffed", func() bool { return s.ConnStats().Sniffing == DefaultMaxSniffing })
	flood(60008, 64, h2(frame(http2.FrameHeaders, 0, 1, 1<<24-1, nil)))
	flood(60009, 64, h2(frame(http2.FrameData, 0, 1, 1<<24-1, make([]byte, 4<<20))))
	waitFor(t, "the other connections refused", func() bool {
		st := s.ConnStats()
		return st.RefusedProtocol+st.RefusedSniffing == 128
	})
	time.Sleep(200 * time.Millisecond) // the stalled ones' last bytes: no event says they were read
	grown := heapInUse() - base
	bound := uint64(DefaultMaxSniffing) * (2*DefaultMaxSniffBytes + 64<<10)
	t.Logf("256 flooding connections, %d being sniffed: the heap grew %d KiB (bound %d KiB)", s.ConnStats().Sniffing, grown>>10, bound>>10)
	if grown > bound {
		t.Errorf("the heap grew %d MiB under the flood; its bound is %d MiB", grown>>20, bound>>20)
	}
}

// heapInUse is the heap's live bytes after a collection.
func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// What clients send is served as before, by the server it speaks to: a
// gRPC call (with grpc-go's content-subtype, which cmux's matcher did not
// take, and with metadata beyond one frame, in CONTINUATION frames), an
// HTTP/1 request, an HTTP/2 request that is not gRPC (answered by the
// HTTP server, which speaks HTTP/1 here), over TLS and not.
func TestSniffServesWhatClientsSend(t *testing.T) {
	s := sniffServer(t, DefaultLimits(), 5*time.Second, nil)
	for _, tc := range []struct {
		name string
		opts []grpc.CallOption
		md   metadata.MD
	}{
		{"application/grpc", nil, nil},
		{"application/grpc+proto", []grpc.CallOption{grpc.CallContentSubtype("proto")}, nil},
		{"40 KiB of metadata", nil, metadata.Pairs("x-big", strings.Repeat("m", 40<<10))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A new connection each: the first request is the one sniffed.
			conn, err := grpc.NewClient(s.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(metadata.NewOutgoingContext(context.Background(), tc.md), wait)
			defer cancel()
			if _, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, tc.opts...); err != nil {
				t.Fatalf("Check: %v", err)
			}
		})
	}
	resp, err := http.Get("http://" + s.Addr().String() + "/livez")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /livez: %v %v", resp, err)
	}
	resp.Body.Close()
	// An h2c request with prior knowledge that is not gRPC reaches the
	// HTTP server, which answers it in HTTP/1.
	c, err := net.Dial("tcp", s.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	req := hpackBlock(":method", "GET", ":scheme", "http", ":path", "/livez", ":authority", "t")
	if _, err := c.Write(h2(frame(http2.FrameHeaders, 0x5, 1, len(req), req))); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	b, _ := io.ReadAll(io.LimitReader(c, 64<<10))
	if !bytes.HasPrefix(bytes.TrimPrefix(b, serverSettings[:]), []byte("HTTP/1.1 ")) {
		t.Errorf("an h2c request that is not gRPC got %q", b)
	}
	if st := s.ConnStats(); st.RefusedProtocol != 0 {
		t.Errorf("clients' connections refused: %+v", st)
	}
}
