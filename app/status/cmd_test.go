package status_test

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/app/status"
	"github.com/phasegate/phasegate/lifecycle"
)

// Main's commands against an App in process: while a phase holds the start,
// status exits 1 naming it; once serving, status, probe and events exit
// 0; a bad command or flag exits 2.
func TestMainAgainstAnApp(t *testing.T) {
	release := make(chan struct{})
	cfg := app.DefaultConfig("runner", "127.0.0.1:0")
	cfg.DrainDelay = 0
	a, err := app.New(cfg, lifecycle.Phase{Name: "cache-dir", Run: func(ctx context.Context, p *lifecycle.Progress) error {
		p.SetTotal(5000, "files")
		p.SetDone(1200)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan error, 1)
	go func() { started <- a.Start(context.Background()) }()
	defer a.Stop(context.Background())
	addr := a.Addr(context.Background()).String()
	main := func(args ...string) (string, int) {
		var out, errOut bytes.Buffer
		code := status.Main(context.Background(), "runner-status", args, status.Env{Stdout: &out, Stderr: &errOut})
		return out.String() + errOut.String(), code
	}
	if out, code := main("status", "--addr", addr); code != status.ExitNotServing || !strings.Contains(out, "cache-dir") || !strings.Contains(out, "1200/5000 files") {
		t.Errorf("status while starting: exit %d\n%s", code, out)
	}
	close(release)
	if err := <-started; err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
		code int
	}{
		{[]string{"status", "--addr", addr}, "lifecycle serving", status.ExitServing},
		{[]string{"status", "--watch", "--addr", addr}, "serving", status.ExitServing},
		{[]string{"probe", "--addr", addr}, "ok", status.ExitServing},
		{[]string{"events", "--until-over", "--addr", addr}, "phase cache-dir", status.ExitServing},
		{[]string{"stats"}, `unknown command "stats"`, status.ExitUnreachable},
		{[]string{"status", "--adr", addr}, "flag provided but not defined", status.ExitUnreachable},
		{nil, "usage: runner-status", status.ExitUnreachable},
	} {
		if out, code := main(tc.args...); code != tc.code || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, want %d and %q\n%s", tc.args, code, tc.code, tc.want, out)
		}
	}
}
