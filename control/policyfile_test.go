package control_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/phasegate/phasegate/control"
)

// Each file would smuggle rights past encoding/json, which keeps the last
// of two keys, matches keys without regard to case, and stops reading at
// the end of the first value. Each is refused whole, naming the key and
// its line; the file that says the same once is accepted.
func TestParsePolicyRefusesSmuggling(t *testing.T) {
	for _, tc := range []struct {
		name, json, want string
	}{
		{"owners twice in a rule", `{"principals": [
		  {"uid": 1000, "owners": ["team1-*"], "owners": ["*"]}]}`, `principals[0].owners at line 2: given twice`},
		{"read_only in two cases", `{"principals": [
		  {"uid": 1000, "owners": ["*"],
		   "READ_ONLY": true, "Read_Only": false}]}`, `principals[0].READ_ONLY at line 3: differs only in case from "read_only"`},
		{"read_only in another case alone", `{"principals": [{"uid": 1000, "owners": ["*"], "Read_Only": false}]}`, `differs only in case from "read_only"`},
		{"a second principals array", `{"principals": [{"uid": 1000, "owners": ["sandbox-*"], "read_only": true}],
		  "principals": [{"uid": 1000, "owners": ["*"]}]}`, `principals at line 2: given twice`},
		{"a top-level key in another case", `{"Principals": [], "principals": []}`, `Principals at line 1: differs only in case from "principals"`},
		{"rate twice", `{"rate": 100, "rate": 0, "principals": []}`, `rate at line 1: given twice`},
		{"an escaped duplicate", `{"principals": [], "principal\u0073": []}`, `principals at line 1: given twice`},
		{"an unknown key", `{"principals": [{"uid": 1, "owners": ["*"], "owner": "x"}]}`, `unknown field "owner"`},
		{"trailing garbage", "{\"principals\": []}\n garbage", "data after the policy's JSON value, at line 2"},
		{"a trailing bracket", `{"principals": []} ]`, "data after the policy's JSON value"},
		{"a second value", `{"principals": []} {"principals": [{"uid": 1, "owners": ["*"]}]}`, "data after the policy's JSON value"},
		{"an object where a list belongs", `{"principals": {"uid": 1}}`, "principals at line 1: an object, where a list belongs"},
		{"deep nesting", `{"principals": [[[[[[[[[]]]]]]]]]}`, "principals[0] at line 1: a list, where an object belongs"},
		{"not UTF-8", "{\"principals\": [{\"identity\": \"cn:\xff\", \"owners\": [\"*\"]}]}", "not UTF-8"},
		{"empty", "  \n", "empty: no JSON value"},
		{"truncated after a comma", "{\"principals\": [{\"uid\": 1000, \"owners\": [\"*\"]}],\n", "truncated: not valid JSON at offset 49 (line 2)"},
		{"truncated in a key", `{"principals": [{"uid": 1000, "ow`, "truncated: not valid JSON at offset 33 (line 1)"},
		{"truncated in a value", `{"principals": [{"uid": 10`, "truncated: not valid JSON at offset 26 (line 1)"},
		{"truncated after the first brace", `{`, "truncated: not valid JSON at offset 1 (line 1)"},
		{"too large", `{"principals": [], "max_leases": 1` + strings.Repeat(" ", control.MaxPolicySize) + `}`, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := control.ParsePolicy(strings.NewReader(tc.json))
			if !errors.Is(err, control.ErrPolicy) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParsePolicy: %v, %v; want an ErrPolicy with %q", p, err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q is more than one line", err)
			}
		})
	}
	p, err := control.ParsePolicy(strings.NewReader(`{"principals": [{"uid": 1000, "owners": ["team1-*"], "read_only": true}]}` + "\n\t "))
	if err != nil {
		t.Fatalf("the policy said once: %v", err)
	}
	if g := p.Grant(control.Principal{Kind: control.Unix, UID: 1000}); g.MayLease("team1-a") || !g.MayRead("team1-a") || g.MayRead("x") {
		t.Errorf("the policy said once grants %+v", g)
	}
}

// A policy file without "rate" gets the default rate, not none; "rate": 0
// is no limit, said explicitly.
func TestParsePolicyRate(t *testing.T) {
	for _, tc := range []struct {
		json string
		want float64
	}{
		{`{"principals": []}`, control.DefaultRate},
		{`{"rate": null, "principals": []}`, control.DefaultRate},
		{`{"rate": 0, "principals": []}`, 0},
		{`{"rate": 2.5, "principals": []}`, 2.5},
	} {
		p, err := control.ParsePolicy(strings.NewReader(tc.json))
		if err != nil || p.Rate != tc.want {
			t.Errorf("%s: rate %v, %v; want %v", tc.json, p.Rate, err, tc.want)
		}
	}
	// -0 as --control-rate gives it: no limit it does not say.
	for _, r := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1, math.Copysign(0, -1)} {
		p := &control.AccessPolicy{Rate: r}
		if err := p.Resolve(); !errors.Is(err, control.ErrPolicy) || !strings.Contains(err.Error(), "want a finite number") {
			t.Errorf("Resolve of rate %v: %v", r, err)
		}
		if _, err := control.NewGuard(p, control.GuardOptions{Service: "x"}); !errors.Is(err, control.ErrPolicy) {
			t.Errorf("NewGuard of rate %v: %v", r, err)
		}
	}
}

// A policy file someone besides root could have written, or one reached
// through a symlink, is refused in one line naming its path, owner and
// mode; a root-owned 0644 file is read.
func TestLoadPolicyRefusesFilesRootDoesNotControl(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to give files to other owners")
	}
	dir := t.TempDir()
	const body = `{"principals": [{"uid": 1000, "owners": ["*"]}]}`
	file := func(name string, mode os.FileMode, uid int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, 0); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := file("good.json", 0o644, 0)
	if _, err := control.LoadPolicy(good); err != nil {
		t.Fatalf("a root-owned 0644 policy: %v", err)
	}
	target := file("nobodys.json", 0o600, 65534)
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(good, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(link, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	fifo := filepath.Join(dir, "fifo.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := file("big.json", 0o600, 0)
	if err := os.Truncate(big, control.MaxPolicySize+1); err != nil {
		t.Fatal(err)
	}
	// A good file in a directory others may write: they could swap it.
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	inOpen := filepath.Join(open, "policy.json")
	if err := os.WriteFile(inOpen, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, path, want string
	}{
		{"in a directory others may write", inOpen, "is writable by others"},
		{"writable by everyone", file("world.json", 0o666, 0), "owner uid 0, mode 0666: must not be writable by group or others"},
		{"writable by the group", file("group.json", 0o620, 0), "owner uid 0, mode 0620: must not be writable by group or others"},
		{"owned by nobody", target, "owner uid 65534, mode 0600: must be owned by root"},
		{"a symlink to a good file, owned by nobody", link, "a symlink (owner uid 65534, mode 0777)"},
		{"a FIFO", fifo, "not a regular file (owner uid 0, mode 0600, type FIFO)"},
		{"a directory", dir, "not a regular file"},
		{"larger than the bound", big, fmt.Sprintf("%d bytes, larger than %d", control.MaxPolicySize+1, control.MaxPolicySize)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := control.LoadPolicy(tc.path)
			if !errors.Is(err, control.ErrPolicy) || !strings.Contains(err.Error(), tc.path) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadPolicy: %v; want an ErrPolicy naming %s and %q", err, tc.path, tc.want)
			}
		})
	}
}
