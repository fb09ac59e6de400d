package server_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/phasegate/phasegate/server"
)

// SetPort gives the address and the drain delay after New: the port binds
// where it says, the drain waits what it says, and it is refused once the
// port is bound, or for a negative delay.
func TestSetPort(t *testing.T) {
	srv, err := server.New(server.Config{DrainDelay: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.SetPort("127.0.0.1:0", -time.Second); err == nil {
		t.Error("SetPort with a negative drain delay succeeded")
	}
	const delay = 200 * time.Millisecond
	if err := srv.SetPort("127.0.0.1:0", delay); err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(context.Background()); err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().(*net.TCPAddr)
	if !addr.IP.IsLoopback() || addr.Port == 0 {
		t.Errorf("bound %v, want a port on loopback", addr)
	}
	if err := srv.SetPort("127.0.0.1:0", 0); !errors.Is(err, server.ErrServing) {
		t.Errorf("SetPort once bound: %v, want ErrServing", err)
	}
	began := time.Now()
	if err := srv.Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The delay set, not Config's hour: the drain waited for it and ended.
	if took := time.Since(began); took < delay || took > time.Minute {
		t.Errorf("Drain took %v, want the %v SetPort gave", took, delay)
	}
}
