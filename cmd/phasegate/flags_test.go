package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"
)

func envFrom(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestServeFlagsAndEnvironment(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(t *testing.T, e env)
		wantErr string
	}{
		{
			name: "defaults",
			check: func(t *testing.T, e env) {
				cfg, opts, err := serveFlags(e)
				lf := opts.log
				if err != nil || cfg.Listen != "127.0.0.1:5008" || cfg.Slots.Prefix != "pg-" || cfg.Slots.Slots != 1024 ||
					cfg.Slots.CIDR.String() != "169.254.128.0/19" || cfg.PoolSize != 16 || cfg.PoolMinReady != 1 ||
					cfg.DrainDelay != 5*time.Second || cfg.StopTimeout != 10*time.Second || lf.format != "text" {
					t.Fatalf("defaults: %+v %+v %v", cfg, lf, err)
				}
			},
		},
		{
			name: "environment fills what flags leave",
			args: []string{"--pool-size=8"},
			env:  map[string]string{"PHASEGATE_POOL_SIZE": "99", "PHASEGATE_POOL_MIN_READY": "3", "PHASEGATE_SLOT_CIDR": "169.254.128.0/18", "PHASEGATE_RECLAIM_KILL_ORPHANS": "true"},
			check: func(t *testing.T, e env) {
				cfg, _, err := serveFlags(e)
				if err != nil || cfg.PoolSize != 8 || cfg.PoolMinReady != 3 || cfg.Slots.CIDR.String() != "169.254.128.0/18" || !cfg.ReclaimKillOrphans {
					t.Fatalf("%+v %v", cfg, err)
				}
			},
		},
		{name: "bad environment value", env: map[string]string{"PHASEGATE_DRAIN_DELAY": "soon"}, wantErr: `PHASEGATE_DRAIN_DELAY="soon"`},
		{name: "stray argument", args: []string{"now"}, wantErr: `unexpected argument "now"`},
		{name: "bad choice", args: []string{"--log-level=loud"}, wantErr: "want one of debug, info, warn, error"},
		{name: "masked cidr", args: []string{"--slot-cidr=169.254.0.7/17"}, wantErr: "did you mean 169.254.0.0/17"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := env{args: tc.args, lookupEnv: envFrom(tc.env), stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}}
			if tc.check != nil {
				tc.check(t, e)
				return
			}
			_, _, err := serveFlags(e)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestEnvName(t *testing.T) {
	for flag, want := range map[string]string{
		"listen":               "PHASEGATE_LISTEN",
		"pool-min-ready":       "PHASEGATE_POOL_MIN_READY",
		"reclaim-kill-orphans": "PHASEGATE_RECLAIM_KILL_ORPHANS",
	} {
		if got := envName(flag); got != want {
			t.Errorf("envName(%q) = %q, want %q", flag, got, want)
		}
	}
}

func TestUsageErrorsExitTwoWithOneLine(t *testing.T) {
	tests := [][]string{
		{},
		{"frobnicate"},
		{"serve", "--slots=0"},
		{"serve", "--pool-size=5", "--pool-min-ready=6"},
		{"status", "--addr"},
		{"probe", "extra"},
	}
	for _, args := range tests {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), env{args: args, lookupEnv: envFrom(nil), stdout: &stdout, stderr: &stderr})
		if code != exitUsage {
			t.Errorf("%v: exit %d, want %d", args, code, exitUsage)
		}
		if len(args) > 1 && strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 {
			t.Errorf("%v: want one line, got %q", args, stderr.String())
		}
	}
}

func TestVersionAndHelp(t *testing.T) {
	var out bytes.Buffer
	if code := run(context.Background(), env{args: []string{"version"}, stdout: &out, stderr: &out}); code != 0 || !strings.HasPrefix(out.String(), "phasegate ") {
		t.Fatalf("version: %d %q", code, out.String())
	}
	out.Reset()
	if code := run(context.Background(), env{args: []string{"serve", "-h"}, lookupEnv: envFrom(nil), stdout: &out, stderr: &out}); code != 0 || !strings.Contains(out.String(), "--pool-min-ready") || !strings.Contains(out.String(), "PHASEGATE_") {
		t.Fatalf("serve -h: %d %q", code, out.String())
	}
}

// serve --check prints the configuration resolved from flags and
// environment, with the worst-case stop and start times, and changes
// nothing.
func TestServeCheckPrintsTheStopBudget(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args   []string
		env    map[string]string
		budget float64
	}{
		// drain 5 + 2 × stop for the port, one stop for the background
		// tasks, one for each of lock, reclaim and populate.
		{[]string{"--drain-delay=5s", "--stop-timeout=3s"}, nil, 5 + 6*3},
		{[]string{"--drain-delay=0s", "--stop-timeout=2s"}, nil, 12},
		{nil, map[string]string{"PHASEGATE_DRAIN_DELAY": "1s", "PHASEGATE_STOP_TIMEOUT": "1s"}, 7},
	} {
		args := append([]string{"serve", "--check", "--state-dir=" + dir + "/state", "--netns-dir=" + dir + "/netns"}, tc.args...)
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), env{args: args, lookupEnv: envFrom(tc.env), stdout: &stdout, stderr: &stderr}); code != exitOK {
			t.Fatalf("%v: exit %d: %s", args, code, stderr.String())
		}
		var got resolvedConfig
		if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, stdout.String())
		}
		if got.StopBudgetSeconds != tc.budget {
			t.Errorf("%v %v: stop budget %vs, want %vs", args, tc.env, got.StopBudgetSeconds, tc.budget)
		}
		// reclaim has no timeout of its own (it lasts as long as there is
		// to reclaim): the start's bound is --start-timeout's default.
		if got.StartBudgetSeconds != 300 {
			t.Errorf("%v %v: start budget %vs, want 300s", args, tc.env, got.StartBudgetSeconds)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("--check made %v", entries)
	}
}
