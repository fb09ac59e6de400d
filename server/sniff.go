package server

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// The port tells gRPC from HTTP before either server owns a connection:
// cmux reads the connection's first bytes, keeps them, and replays them to
// the server it hands the connection to. What it may read, and so keep, is
// bounded here, not in cmux: the connection under it counts the bytes read
// before the handover ([Limits.MaxSniffBytes]) and carries one deadline for
// the whole decision, reads and writes ([Config.SniffTimeout]); and the
// decision is made by the server's own reader, which reads a frame at a
// time, refuses frames no gRPC client sends before its first request, and
// never allocates more than the frame it reads. cmux's own HTTP/2 matcher
// answers every SETTINGS frame with a write and reads frames of up to
// 16 MiB into memory (http2.Framer), so one client could make the process
// hold gigabytes while the port was still deciding: docs/DESIGN.md,
// "The port before the protocol".

// protocol is what a connection showed it speaks, decided once by
// [decide] and read by each of the multiplexer's matchers.
type protocol uint8

const (
	undecided protocol = iota
	speaksGRPC
	speaksHTTP
	// refused: it sent what no client sends before its first request,
	// more than MaxSniffBytes, or nothing before SniffTimeout; no server
	// gets it, and the multiplexer closes it.
	refused
)

// maxPreRequestFrame is the largest frame the port reads before a
// connection's first request: HTTP/2's initial SETTINGS_MAX_FRAME_SIZE,
// which a client must respect until the server raises it, and the port's
// SETTINGS raise nothing.
const maxPreRequestFrame = 16 << 10

// serverSettings is an empty SETTINGS frame: the server's connection
// preface, which gRPC clients wait for before they send their first
// request. The gRPC server sends its own when it takes the connection; a
// second SETTINGS frame is legal and acknowledged like the first.
var serverSettings = [9]byte{0, 0, 0, byte(http2.FrameSettings), 0, 0, 0, 0, 0}

// errNotGRPC ends reading a connection's first request once it is known
// not to be a gRPC call.
var errNotGRPC = errors.New("not a gRPC call")

// decide reads as much of a new connection as it takes to know what it
// speaks: an HTTP/1 request (anything but HTTP/2's client preface goes to
// the HTTP server, which answers what is not HTTP with 400), or HTTP/2
// whose first request has a gRPC content-type. w is where the server's
// preface goes; its writes carry the connection's sniff deadline. A
// refused connection comes with why.
func decide(w io.Writer, r io.Reader) (protocol, error) {
	switch ok, err := readPreface(r); {
	case err != nil:
		return refused, err
	case !ok:
		return speaksHTTP, nil
	}
	if _, err := w.Write(serverSettings[:]); err != nil {
		return refused, err
	}
	grpc, err := readFirstRequest(r)
	switch {
	case grpc:
		return speaksGRPC, nil
	case errors.Is(err, errNotGRPC):
		// An HTTP/2 request of another kind (h2c with prior knowledge):
		// the HTTP server, which speaks HTTP/1 on this port, answers it.
		return speaksHTTP, nil
	}
	return refused, err
}

// readPreface reads the start of the connection for as long as it matches
// HTTP/2's client preface: ok once it is whole, false at the first byte
// that differs. It reads nothing past the preface.
func readPreface(r io.Reader) (ok bool, err error) {
	var b [len(http2.ClientPreface)]byte
	for n := 0; n < len(b); {
		m, err := r.Read(b[n:])
		if m == 0 && err != nil {
			return false, err
		}
		if string(b[n:n+m]) != http2.ClientPreface[n:n+m] {
			return false, nil
		}
		n += m
	}
	return true, nil
}

// HTTP/2 frame flags the first request's reader looks at (RFC 9113, 6.2).
const (
	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20
)

// readFirstRequest reads HTTP/2 frames up to the end of the first HEADERS
// block and reports whether its content-type is gRPC's. Before it, only the
// frames a client sends with its preface are read: SETTINGS and its
// acknowledgement, WINDOW_UPDATE, PING and PRIORITY; DATA or any other
// frame, or one over maxPreRequestFrame, is an error.
func readFirstRequest(r io.Reader) (grpc bool, err error) {
	var (
		buf    []byte // the frame being read; as large as the largest so far
		stream uint32 // the HEADERS frame's, once read
		found  bool   // a content-type was decoded
	)
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == "content-type" && !found {
			found, grpc = true, isGRPCContentType(f.Value)
		}
	})
	first := true
	for {
		h, err := http2.ReadFrameHeader(r)
		if err != nil {
			return false, err
		}
		if h.Length > maxPreRequestFrame {
			return false, frameError(h, "larger than HTTP/2's initial frame size")
		}
		buf = slices.Grow(buf[:0], int(h.Length))
		p := buf[:h.Length]
		if _, err := io.ReadFull(r, p); err != nil {
			return false, err
		}
		switch {
		case first && (h.Type != http2.FrameSettings || h.Flags&http2.FlagSettingsAck != 0):
			// RFC 9113, 3.4: the preface goes on with a SETTINGS frame.
			return false, frameError(h, "first after the preface: want SETTINGS")
		case stream == 0 && h.Type == http2.FrameHeaders:
			if stream = h.StreamID; stream == 0 || stream%2 == 0 {
				return false, frameError(h, "on a stream a client may not open")
			}
			if p, err = headerBlock(h, p); err != nil {
				return false, err
			}
		case stream != 0 && h.Type == http2.FrameContinuation && h.StreamID == stream:
		case stream == 0 && preRequest(h):
			first = false
			continue
		default:
			return false, frameError(h, "before the first request's headers end")
		}
		if _, err := dec.Write(p); err != nil {
			return false, err
		}
		if found {
			return grpc, nil
		}
		if h.Flags&flagEndHeaders != 0 {
			if err := dec.Close(); err != nil {
				return false, err // a block cut short
			}
			return false, errNotGRPC
		}
	}
}

// preRequest reports whether h is a frame a client may send before its
// first request, of the size its type has.
func preRequest(h http2.FrameHeader) bool {
	switch h.Type {
	case http2.FrameSettings:
		return h.StreamID == 0 && h.Length%6 == 0 && (h.Flags&http2.FlagSettingsAck == 0 || h.Length == 0)
	case http2.FrameWindowUpdate:
		return h.Length == 4
	case http2.FramePing:
		return h.StreamID == 0 && h.Length == 8
	case http2.FramePriority:
		return h.StreamID != 0 && h.Length == 5
	}
	return false
}

// headerBlock returns the header block fragment of a HEADERS frame's
// payload p: without its padding and priority fields.
func headerBlock(h http2.FrameHeader, p []byte) ([]byte, error) {
	if h.Flags&flagPadded != 0 {
		if len(p) == 0 || int(p[0]) >= len(p) {
			return nil, frameError(h, "with more padding than payload")
		}
		p = p[1 : len(p)-int(p[0])]
	}
	if h.Flags&flagPriority != 0 {
		if len(p) < 5 {
			return nil, frameError(h, "too short for its priority")
		}
		p = p[5:]
	}
	return p, nil
}

// isGRPCContentType is grpc-go's own test: application/grpc, alone or
// with a subtype (+proto) or parameters.
func isGRPCContentType(v string) bool {
	rest, ok := strings.CutPrefix(strings.ToLower(v), "application/grpc")
	return ok && (rest == "" || rest[0] == '+' || rest[0] == ';')
}

// frameError says which frame ended the reading of a first request.
func frameError(h http2.FrameHeader, why string) error {
	return &frameRefusedError{Type: h.Type, Length: h.Length, Why: why}
}

// frameRefusedError is an HTTP/2 frame the port refused before a
// connection's first request: the connection is closed unserved.
type frameRefusedError struct {
	Type   http2.FrameType
	Length uint32 // the frame's payload, as its header says
	Why    string
}

func (e *frameRefusedError) Error() string {
	return fmt.Sprintf("server: HTTP/2 %v frame of %d bytes %s", e.Type, e.Length, e.Why)
}
