package cniv1

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// maxAnswer bounds an answer read: far above any the daemon writes.
const maxAnswer = 1 << 20

// Client calls the daemon on its control socket.
type Client struct {
	// Socket is the control socket's path.
	Socket string
	// File, when set, is passed with the request's first bytes
	// (SCM_RIGHTS): for ADD and CHECK, the container's network namespace,
	// opened by the caller with its own credentials, which the daemon
	// uses instead of opening CNI_NETNS itself (docs/DESIGN.md §11).
	File *os.File
}

// Call sends req to path and decodes the answer into answer (nil: the
// answer is not read). It fails with an [*Error] the daemon answered, an
// [*UnavailableError] when the daemon is not there or does not serve, or
// another error naming the socket. ctx bounds the whole call.
func (c Client) Call(ctx context.Context, path string, req, answer any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", path, err)
	}
	raw, err := c.roundTrip(ctx, path, body)
	if err != nil {
		return err
	}
	code, ctype, payload, err := parseAnswer(raw)
	if err != nil {
		return fmt.Errorf("phasegate control socket %s: %s: %w", c.Socket, path, err)
	}
	return decodeAnswer(code, ctype, payload, answer)
}

// Wait is [Client.Call] made again while the daemon is unavailable, every
// interval until ctx ends; then the last [*UnavailableError] is returned,
// wrapped with how long it waited.
func (c Client) Wait(ctx context.Context, interval time.Duration, path string, req, answer any) error {
	start := time.Now()
	for {
		err := c.Call(ctx, path, req, answer)
		var un *UnavailableError
		if !errors.As(err, &un) {
			return err
		}
		t := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("waited %v: %w", time.Since(start).Round(time.Millisecond), err)
		case <-t.C:
		}
	}
}

// roundTrip writes one HTTP/1.0 request and reads the answer to the end
// of the connection, which the server closes after it.
func (c Client) roundTrip(ctx context.Context, path string, body []byte) ([]byte, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.Socket)
	if err != nil {
		switch {
		case errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED):
			return nil, &UnavailableError{Reason: fmt.Sprintf("nothing listens on %s (is the daemon running, or restarting?)", c.Socket)}
		case errors.Is(err, syscall.EAGAIN):
			return nil, &UnavailableError{Reason: fmt.Sprintf("%s takes no more connections for now", c.Socket)}
		case ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
			// The dialer's deadline is the context's, and may pass a moment
			// before the context says so; net's "i/o timeout" of a dial is
			// context.DeadlineExceeded, not os.ErrDeadlineExceeded.
			return nil, &UnavailableError{Reason: fmt.Sprintf("no connection to %s within the timeout", c.Socket)}
		}
		return nil, fmt.Errorf("connect to phasegate control socket %s: %w", c.Socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var req bytes.Buffer
	fmt.Fprintf(&req, "POST %s HTTP/1.0\r\nHost: phasegate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, len(body))
	req.Write(body)
	if err := c.send(conn, req.Bytes()); err != nil {
		return nil, c.ioError(ctx, path, "send", err)
	}
	raw, err := io.ReadAll(io.LimitReader(conn, maxAnswer+1))
	if err != nil {
		return nil, c.ioError(ctx, path, "read the answer", err)
	}
	if len(raw) > maxAnswer {
		return nil, fmt.Errorf("phasegate control socket %s: %s: answer longer than %d bytes", c.Socket, path, maxAnswer)
	}
	return raw, nil
}

// send writes b on conn, with File's descriptor on its first bytes when
// File is set. A stream socket may take only part of b with the
// descriptor; the rest follows as plain bytes.
func (c Client) send(conn net.Conn, b []byte) error {
	uc, ok := conn.(*net.UnixConn)
	if c.File == nil || !ok {
		_, err := conn.Write(b)
		return err
	}
	rc, err := c.File.SyscallConn()
	if err != nil {
		return fmt.Errorf("pass %s: %w", c.File.Name(), err)
	}
	var n int
	if cerr := rc.Control(func(fd uintptr) {
		n, _, err = uc.WriteMsgUnix(b, syscall.UnixRights(int(fd)), nil)
	}); cerr != nil {
		return fmt.Errorf("pass %s: %w", c.File.Name(), cerr)
	}
	if err == nil && n < len(b) {
		_, err = conn.Write(b[n:])
	}
	return err
}

// ioError names a failed send or read, and the context's end when that
// was the cause.
func (c Client) ioError(ctx context.Context, path, what string, err error) error {
	if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
		// The daemon took the call and did not answer in time: whether it
		// finished is unknown, as with any timed-out call; the runtime's
		// DEL ends what it made.
		return &UnavailableError{Reason: fmt.Sprintf("%s: no answer on %s within the timeout (%s)", path, c.Socket, what)}
	}
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		// The daemon closed the connection unread: it stopped or
		// restarted meanwhile, before taking the call.
		return &UnavailableError{Reason: fmt.Sprintf("%s closed the connection (the daemon stopped or restarted)", c.Socket)}
	}
	return fmt.Errorf("phasegate control socket %s: %s: %s: %w", c.Socket, path, what, err)
}

// parseAnswer splits an HTTP/1.x answer into its status code, content
// type and body.
func parseAnswer(raw []byte) (code int, ctype string, body []byte, err error) {
	head, body, ok := bytes.Cut(raw, []byte("\r\n\r\n"))
	if !ok {
		return 0, "", nil, fmt.Errorf("truncated answer (%d bytes, no end of headers)", len(raw))
	}
	lines := strings.Split(string(head), "\r\n")
	proto, rest, _ := strings.Cut(lines[0], " ")
	codeText, _, _ := strings.Cut(rest, " ")
	code, err = strconv.Atoi(codeText)
	if !strings.HasPrefix(proto, "HTTP/1.") || err != nil {
		return 0, "", nil, fmt.Errorf("not an HTTP answer: %.80q", lines[0])
	}
	for _, l := range lines[1:] {
		k, v, _ := strings.Cut(l, ":")
		if strings.EqualFold(strings.TrimSpace(k), "Content-Type") {
			ctype = strings.TrimSpace(v)
		}
	}
	return code, ctype, body, nil
}

// decodeAnswer turns an answer into the caller's value or an error.
func decodeAnswer(code int, ctype string, body []byte, answer any) error {
	isJSON := strings.HasPrefix(ctype, "application/json")
	switch {
	case code == 200 && answer == nil:
		return nil
	case code == 200 && isJSON:
		if err := json.Unmarshal(body, answer); err != nil {
			return &Error{Code: CodeDecodingFailure, Msg: "decode the daemon's answer", Details: err.Error()}
		}
		return nil
	case isJSON:
		e := &Error{}
		if err := json.Unmarshal(body, e); err != nil || e.Code == 0 {
			return &Error{Code: CodeIOFailure, Msg: fmt.Sprintf("daemon answered %d with an unreadable error", code), Details: string(bytes.TrimSpace(body))}
		}
		return e
	case code == 503:
		// The route's gate: starting (with the phase) or draining.
		return &UnavailableError{Reason: string(bytes.TrimSpace(body))}
	}
	return &Error{Code: CodeIOFailure, Msg: fmt.Sprintf("daemon answered %d", code), Details: string(bytes.TrimSpace(body))}
}
