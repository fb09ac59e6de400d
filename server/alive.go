package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/phasegate/phasegate/health"
)

// Alive is a self-probe for a watchdog (sdnotify.Options.Alive):
// while the server serves, it asks its own port for /livez over a new
// connection, as a checker would, and reports an error unless the answer
// was 200. The request goes through the whole path — accept, TLS, the
// multiplexer, the HTTP server, and the health handler, which reads the
// lifecycle — so a wedged accept loop or lifecycle fails it. ctx bounds it.
//
// Before [Server.Serve], and from the moment the server drains, there is
// no port that must answer and Alive returns nil: what proves the daemon
// alive then is up to the caller. It needs [Config.Health], which serves
// /livez.
func (s *Server) Alive(ctx context.Context) error {
	s.mu.Lock()
	serving, lis := s.serving && s.drainDone == nil, s.lis
	s.mu.Unlock()
	if !serving {
		return nil
	}
	network, addr := probeAddr(lis.Addr())
	if err := s.probe(ctx, network, addr); err != nil {
		return fmt.Errorf("server: self-probe of %s %s: %w", network, addr, err)
	}
	return nil
}

// probe sends one GET of /livez over a connection of its own, closed
// after the answer, and reads the answer. It writes the request and reads
// the response with net/http's own Request.Write and ReadResponse, but
// without an http.Client: a Transport (pooling, proxies, HTTP/2, SOCKS)
// weighs about 300 KB in every binary built on the App, and a probe of
// its own port needs none of it.
func (s *Server) probe(ctx context.Context, network, addr string) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	scheme := "http"
	if s.cfg.TLS != nil {
		// Its own listener, on an address it just read from it: there is
		// no peer to authenticate, only a path to exercise.
		tc := tls.Client(conn, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"http/1.1"}})
		if err := tc.HandshakeContext(ctx); err != nil {
			return err
		}
		scheme, conn = "https", tc
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, scheme+"://self"+health.PathLivez, nil)
	if err != nil {
		return err
	}
	req.Close = true // each probe goes through accept and the multiplexer
	if err := req.Write(conn); err != nil {
		return err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		line, _ := bufio.NewReader(io.LimitReader(resp.Body, 512)).ReadString('\n')
		return fmt.Errorf("GET %s = %s: %s", health.PathLivez, resp.Status, strings.TrimSpace(line))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return nil
}

// probeAddr is where to reach a listener from its own host: a wildcard
// address is reached on loopback.
func probeAddr(a net.Addr) (network, addr string) {
	ta, ok := a.(*net.TCPAddr)
	if !ok || !ta.IP.IsUnspecified() {
		return a.Network(), a.String()
	}
	ip := net.IPv4(127, 0, 0, 1)
	if ta.IP.To4() == nil {
		ip = net.IPv6loopback
	}
	return "tcp", net.JoinHostPort(ip.String(), fmt.Sprint(ta.Port))
}
