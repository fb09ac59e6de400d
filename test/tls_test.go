package test

import (
	"context"
	"crypto/tls"
	"net/http"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
	"github.com/phasegate/phasegate/internal/testcerts"
)

// With TLS and a client CA, health is open to checkers without a client
// certificate (HTTPS, grpc-health-probe, phasegate probe) and plain HTTP
// is not answered; the Slots API on the port needs a client certificate
// and a policy rule for its identity, which becomes the lease's
// principal.
func TestMutualTLS(t *testing.T) {
	probe := lookTool(t, "grpc-health-probe", "go install github.com/grpc-ecosystem/grpc-health-probe@v0.4.62")
	certs, err := testcerts.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := certs.WriteFiles(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	h := newHost(t)
	addr := freePort(t)
	// The client certificate's identity (its CN, sandbox-scheduler: it has
	// no SAN) may lease for the owner "scheduler" only; the rule names
	// the kind of identity it matches.
	d := start(t, nil, h.args(addr, "--slots=64",
		"--tls-cert="+certs.ServerCert, "--tls-key="+certs.ServerKey, "--tls-client-ca="+certs.CAFile,
		"--allow=id:cn:sandbox-scheduler=scheduler")...)

	checkHealthOpenOverTLS(t, probe, addr, certs)

	// The Slots API on the port needs a client certificate, and a policy
	// rule for its identity.
	dialTLS := func(cert bool) phasegatev1.SlotsClient {
		cfg := &tls.Config{RootCAs: certs.CAPool}
		if cert {
			cfg.Certificates = []tls.Certificate{certs.Client}
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return phasegatev1.NewSlotsClient(conn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := dialTLS(false).Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "anon"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("Acquire without a client certificate: %v, want Unauthenticated", err)
	}
	resp, err := dialTLS(true).Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "scheduler", RequestId: "s1"})
	if err != nil {
		t.Fatalf("Acquire with a client certificate: %v", err)
	}
	if got := resp.GetSlot().GetPrincipal(); got != "x509:cn:sandbox-scheduler" {
		t.Errorf("the lease's principal is %q, want x509:cn:sandbox-scheduler", got)
	}
	if _, err := dialTLS(true).Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "someone-else", RequestId: "s2"}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("Acquire with a client certificate for an owner its rule does not name: %v, want PermissionDenied", err)
	}
	if _, err := dialTLS(true).Release(ctx, &phasegatev1.ReleaseRequest{Index: resp.GetSlot().GetIndex(), LeaseId: resp.GetLeaseId()}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	h.stoppedCleanly(h.prefix, nil)
}

// checkHealthOpenOverTLS checks health answers checkers without a client
// certificate over TLS (HTTPS /readyz, grpc-health-probe, phasegate probe
// over gRPC and HTTP), and plain HTTP is not answered on the TLS port.
func checkHealthOpenOverTLS(t *testing.T, probe, addr string, certs *testcerts.Set) {
	t.Helper()
	https := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: certs.CAPool}, ForceAttemptHTTP2: true}}
	waitFor(t, time.Minute, "HTTPS /readyz to answer 200", func() bool {
		resp, err := https.Get("https://" + addr + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	out, err := exec.Command(probe, "-addr="+addr, "-tls", "-tls-ca-cert="+certs.CAFile).CombinedOutput()
	if exitCode(err) != 0 {
		t.Errorf("grpc-health-probe over TLS: exit %d %s", exitCode(err), out)
	}
	if out, code := cli(t, "probe", "--addr="+addr, "--tls-ca="+certs.CAFile); code != 0 {
		t.Errorf("phasegate probe over TLS: exit %d %s", code, out)
	}
	if out, code := cli(t, "probe", "--http", "--addr="+addr, "--tls-ca="+certs.CAFile); code != 0 {
		t.Errorf("phasegate probe --http over TLS: exit %d %s", code, out)
	}
	if _, err := (&http.Client{Timeout: 2 * time.Second}).Get("http://" + addr + "/health"); err == nil {
		t.Error("plain HTTP was answered on the TLS port")
	}
}
