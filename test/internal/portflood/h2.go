package portflood

import (
	"bytes"
	"crypto/tls"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// h2Flood is what one connection of an H2 flood sends after HTTP/2's client
// preface and a SETTINGS frame.
type h2Flood struct {
	// first is written once; then repeat, over and over, unless nil.
	first, repeat []byte
	// smallWindow: the client never reads, and lets the kernel keep
	// little of what the server writes for it.
	smallWindow bool
}

// frame is an HTTP/2 frame's header saying length, and payload.
func frame(typ, flags byte, stream uint32, length int, payload []byte) []byte {
	b := []byte{byte(length >> 16), byte(length >> 8), byte(length), typ, flags,
		byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}
	return append(b, payload...)
}

const (
	frameData     = 0x0
	frameHeaders  = 0x1
	frameSettings = 0x4
	framePing     = 0x6
)

// stallBytes is what a stall connection sends: just under the port's
// default bound on what it reads before it knows the protocol
// (server.DefaultMaxSniffBytes), all of it frames a client may send first.
const stallBytes = 80<<10 - 256

// h2FloodNamed is the H2 flood of that name:
//   - h2data: DATA frames of 16 MiB, one after another, on each connection
//     (cmux kept every byte it read while it looked for a HEADERS frame);
//   - h2header: the 9-byte header of a 16 MiB HEADERS frame, then nothing
//     (http2.Framer allocated 16 MiB for it);
//   - stall: PING frames up to just under the bound, then nothing: the
//     most a connection may make the port hold until the sniff timeout;
//   - noread: SETTINGS frames one after another, never reading what the
//     server writes (cmux answered each with a write without a deadline).
func h2FloodNamed(name string) (h2Flood, bool) {
	switch name {
	case "h2data":
		return h2Flood{repeat: frame(frameData, 0, 1, 1<<24-1, make([]byte, 1<<24-1))}, true
	case "h2header":
		return h2Flood{first: frame(frameHeaders, 0, 1, 1<<24-1, nil)}, true
	case "stall":
		return h2Flood{first: bytes.Repeat(frame(framePing, 0, 0, 8, make([]byte, 8)), stallBytes/17)}, true
	case "noread":
		return h2Flood{repeat: bytes.Repeat(frame(frameSettings, 0, 0, 0, nil), 1024), smallWindow: true}, true
	}
	return h2Flood{}, false
}

// H2 keeps n connections of flood f open to addr (tls://host:port: over
// TLS, with no client certificate and the server's unverified), each
// redialled once the server ends it, until until; ready is called once
// the first n were dialled. It reports what the kernel took of what they
// wrote, the longest a connection lived, and how many the server refused
// at once (ended within 100 ms without reading a byte of the flood).
func H2(f h2Flood, addr string, n int, until time.Time, ready func()) Report {
	var (
		sent, attempts, refused atomic.Int64
		mu                      sync.Mutex
		longest                 time.Duration
		wg                      sync.WaitGroup
		once                    sync.Once
	)
	var dialled atomic.Int64
	for range n {
		wg.Go(func() {
			for time.Now().Before(until) {
				attempts.Add(1)
				start := time.Now()
				wrote, err := f.run(addr, until)
				if dialled.Add(1) == int64(n) {
					once.Do(ready)
				}
				lived := time.Since(start)
				sent.Add(wrote)
				// A flood, not a spin: the test's machine is the daemon's
				// too, and over TLS each connection costs both ends a
				// handshake, which is CPU, not the memory the flood is after.
				pause := 25 * time.Millisecond
				if strings.HasPrefix(addr, "tls://") {
					pause = 100 * time.Millisecond
				}
				if err != nil && lived < 100*time.Millisecond && wrote == 0 {
					refused.Add(1)
					pause = 250 * time.Millisecond
				}
				if time.Now().Before(until) {
					mu.Lock()
					longest = max(longest, lived)
					mu.Unlock()
				}
				time.Sleep(pause)
			}
		})
	}
	wg.Wait()
	once.Do(ready)
	return Report{Attempts: int(attempts.Load()), Refused: int(refused.Load()), Sent: sent.Load(), Longest: longest.Seconds()}
}

// run is one connection of f: it returns when the server ended it, or at
// until, with what the kernel took of what it wrote beyond the preface.
func (f h2Flood) run(addr string, until time.Time) (int64, error) {
	raw, err := net.DialTimeout("tcp", strings.TrimPrefix(addr, "tls://"), 2*time.Second)
	if err != nil {
		return 0, err
	}
	defer raw.Close()
	if f.smallWindow {
		_ = raw.(*net.TCPConn).SetReadBuffer(2048)
	}
	c := raw
	if strings.HasPrefix(addr, "tls://") {
		tc := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}}) // an attacker checks nothing
		_ = tc.SetDeadline(until)
		if err := tc.Handshake(); err != nil {
			return 0, err
		}
		c = tc
	}
	ended := make(chan struct{})
	if !f.smallWindow {
		go func() { // the server's end: a reset or end of file
			_, _ = c.Read(make([]byte, 1<<10))
			for {
				if _, err := c.Read(make([]byte, 1<<10)); err != nil {
					break
				}
			}
			close(ended)
		}()
	}
	_ = c.SetWriteDeadline(until)
	preface := append([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"), frame(frameSettings, 0, 0, 0, nil)...)
	if _, err := c.Write(preface); err != nil {
		return 0, err
	}
	var wrote int64
	if len(f.first) > 0 {
		m, err := c.Write(f.first)
		wrote += int64(m)
		if err != nil {
			return wrote, err
		}
	}
	for f.repeat != nil {
		m, err := c.Write(f.repeat)
		wrote += int64(m)
		if err != nil {
			return wrote, err
		}
	}
	select {
	case <-ended:
		return wrote, net.ErrClosed
	case <-time.After(time.Until(until)):
		return wrote, nil
	}
}
