package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
)

// --publish takes podman's -p spelling, repeated, into the request's
// ports; a bad one exits 2 with one line, nothing sent.
func TestPublishFlag(t *testing.T) {
	fs, f := newSlotsFlagSet()
	if err := fs.Parse([]string{"--publish", "8080:80", "--publish", "127.0.0.1:5353:53/udp"}); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range f.publish {
		got = append(got, p.GetHostIp()+" "+p.GetProtocol())
	}
	if want := []string{" tcp", "127.0.0.1 udp"}; !slices.Equal(got, want) || f.publish[1].GetHostPort() != 5353 || f.publish[1].GetSlotPort() != 53 {
		t.Fatalf("--publish read %v (%v), want %v", got, f.publish, want)
	}
	for _, bad := range []string{"70000:80", "8080:80/icmp", "8080"} {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), env{args: []string{"slots", "acquire", "o", "--publish", bad}, lookupEnv: envFrom(nil), stdout: &stdout, stderr: &stderr})
		if code != exitUsage || strings.Count(strings.TrimSpace(stderr.String()), "\n") != 0 || !strings.Contains(stderr.String(), "invalid mapping") {
			t.Errorf("--publish %s: exit %d, %q; want %d and one line naming the mapping", bad, code, stderr.String(), exitUsage)
		}
	}
}
