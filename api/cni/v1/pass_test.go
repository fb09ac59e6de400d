package cniv1_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	cniv1 "github.com/phasegate/phasegate/api/cni/v1"
)

// A Client with a File passes its descriptor with the request's first
// bytes, and the whole request follows, however large.
func TestCallPassesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "control.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "passed"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want, _ := f.Stat()
	type got struct {
		ino   uint64
		bytes int
	}
	gotc := make(chan got, 1)
	go func() {
		c, err := l.AcceptUnix()
		if err != nil {
			return
		}
		defer c.Close()
		buf, oob := make([]byte, 4<<20), make([]byte, unix.CmsgSpace(4))
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		var g got
		if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); err == nil && perr == nil && len(msgs) == 1 {
			if fds, _ := unix.ParseUnixRights(&msgs[0]); len(fds) == 1 {
				var st unix.Stat_t
				_ = unix.Fstat(fds[0], &st)
				g.ino = st.Ino
				unix.Close(fds[0])
			}
		}
		g.bytes = n
		body := `{"released":1}`
		for last := buf[:n]; err == nil && (g.bytes < len(big) || last[len(last)-1] != '}'); {
			var m int
			m, err = c.Read(buf)
			g.bytes, last = g.bytes+m, buf[:m]
		}
		gotc <- g
		_, _ = c.Write([]byte("HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n" + body))
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var a cniv1.GCAnswer
	if err := (cniv1.Client{Socket: path, File: f}).Call(ctx, cniv1.PathGC, map[string]string{"pad": big}, &a); err != nil || a.Released != 1 {
		t.Fatalf("Call: %v %+v", err, a)
	}
	g := <-gotc
	if g.ino != want.Sys().(*syscall.Stat_t).Ino {
		t.Errorf("the daemon's side got inode %d with the first bytes, want the file's, %d", g.ino, want.Sys().(*syscall.Stat_t).Ino)
	}
	if g.bytes < len(big) {
		t.Errorf("the daemon's side got %d bytes, want the whole request (%d and more)", g.bytes, len(big))
	}
}

// big is larger than a Unix socket's send buffer: the first sendmsg
// takes part of it.
var big = strings.Repeat("a", 3<<20)
