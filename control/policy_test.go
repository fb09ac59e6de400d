package control_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/phasegate/phasegate/control"
)

func TestParsePolicyRefusesWhatCannotBeUsed(t *testing.T) {
	for _, tc := range []struct {
		name, json, want string
	}{
		{"unknown field", `{"principals": [{"uid": 1, "owners": ["*"], "owner": "x"}]}`, `unknown field "owner"`},
		{"not JSON", `principals: []`, "invalid character"},
		{"two values", `{} {}`, "data after the policy's JSON value"},
		{"no selector", `{"principals": [{"owners": ["*"]}]}`, "exactly one of"},
		{"two selectors", `{"principals": [{"uid": 1, "gid": 2, "owners": ["*"]}]}`, "exactly one of"},
		{"no owners", `{"principals": [{"uid": 1}]}`, "needs owners"},
		{"star inside", `{"principals": [{"uid": 1, "owners": ["a*b"]}]}`, `"*" may only end`},
		{"unknown user", `{"principals": [{"user": "no-such-user-phasegate", "owners": ["*"]}]}`, "no-such-user-phasegate"},
		{"unknown group", `{"principals": [{"group": "no-such-group-phasegate", "owners": ["*"]}]}`, "no-such-group-phasegate"},
		{"negative quota", `{"max_leases": -1, "principals": []}`, "negative"},
		{"negative rule quota", `{"principals": [{"uid": 1, "owners": ["*"], "max_leases": -2}]}`, "negative"},
		{"negative ports quota", `{"max_ports": -1, "principals": []}`, "max_ports -1 is negative"},
		{"negative rule ports quota", `{"principals": [{"uid": 1, "owners": ["*"], "max_ports": -2}]}`, "max_ports -2 is negative"},
		{"negative rate", `{"rate": -1, "principals": []}`, "rate -1: want a finite number"},
		{"identity without its kind", `{"principals": [{"identity": "sandbox-scheduler", "owners": ["*"]}]}`, "write uri:sandbox-scheduler"},
		{"identity of an unknown kind", `{"principals": [{"identity": "email:a@b", "owners": ["*"]}]}`, "does not say which part"},
		{"identity as a principal's name", `{"principals": [{"identity": "x509:uri:spiffe://x/y", "owners": ["*"]}]}`, "does not say which part"},
		{"identity kind without a value", `{"principals": [{"identity": "cn:", "owners": ["*"]}]}`, "empty identity pattern"},
		{"attach read-only", `{"principals": [{"uid": 1, "owners": ["cni/*"], "read_only": true, "attach": true}]}`, "cannot grant attach"},
		// Owner patterns follow the names rule, whether the file writes
		// the character raw or as a JSON escape; the error names the
		// field and the code point, and shows the pattern escaped.
		{"U+3164 in an owner", "{\"principals\": [{\"uid\": 1, \"owners\": [\"a\", \"rt-victim\u3164\"]}]}", `principals[0]: control policy: owners[1] "rt-victim\u3164": U+3164, outside ASCII (Lo, Hangul), at byte 9: names are`},
		{"U+3164 escaped in JSON", `{"principals": [{"uid": 1, "owners": ["rt-victim\u3164"]}]}`, `owners[0] "rt-victim\u3164": U+3164`},
		{"a Cyrillic a in a prefix", `{"principals": [{"uid": 1, "owners": ["rt-vict\u0430*"]}]}`, `owners[0] "rt-vict\u0430*": U+0430, outside ASCII (Ll, Cyrillic)`},
		{"a zero-width space", `{"principals": [{"uid": 1, "owners": ["\u200b*"]}]}`, `"\u200b*": U+200B`},
		{"a space", `{"principals": [{"uid": 1, "owners": ["rt-victim "]}]}`, `"rt-victim\x20": U+0020, a space`},
		{"ESC", `{"principals": [{"uid": 1, "owners": ["\u001b[2K"]}]}`, "U+001B, a control character"},
		{"NUL in an owner", `{"principals": [{"uid": 1, "owners": ["sandbox-\u0000*"]}]}`, `owners[0] "sandbox-\x00*": U+0000, a control character, at byte 8`},
		{"NUL in an owner prefix's end", `{"principals": [{"uid": 1, "owners": ["a", "rt-victim\u0000"]}]}`, `owners[1] "rt-victim\x00": U+0000`},
		{"NUL in an identity", `{"principals": [{"identity": "cn:sched\u0000uler", "owners": ["*"]}]}`, `identity pattern "sched\x00uler": U+0000, a control character, at byte 5`},
		{"ESC in an identity", `{"principals": [{"identity": "spiffe://x/\u001b*", "owners": ["*"]}]}`, `U+001B, a control character`},
		// A negative zero is refused wherever a number goes, however it
		// is written: JSON decodes it as 0 without a word.
		{"rate -0", `{"rate": -0, "principals": []}`, "rate at line 1: -0 is a negative zero"},
		{"rate -0.0", `{"rate": -0.0, "principals": []}`, "-0.0 is a negative zero"},
		{"rate -0e5", "{\n\"rate\": -0e5, \"principals\": []}", "rate at line 2: -0e5 is a negative zero"},
		{"rate that rounds to -0", `{"rate": -1e-400, "principals": []}`, "-1e-400 is a negative zero"},
		{"max_leases -0", `{"max_leases": -0, "principals": []}`, "max_leases at line 1: -0 is a negative zero"},
		{"max_ports -0", `{"max_ports": -0, "principals": []}`, "max_ports at line 1: -0 is a negative zero"},
		{"a rule's max_leases -0", `{"principals": [{"uid": 1, "owners": ["*"], "max_leases": -0}]}`, "principals[0].max_leases at line 1: -0 is a negative zero"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := control.ParsePolicy(strings.NewReader(tc.json))
			if !errors.Is(err, control.ErrPolicy) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParsePolicy: %v, want an ErrPolicy naming %q", err, tc.want)
			}
		})
	}
}

func TestLoadPolicyNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.json")
	if err := os.WriteFile(path, []byte(`{"principals": [{"uid": 1, "owners": []}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := control.LoadPolicy(path); err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("LoadPolicy: %v, want an error naming %s", err, path)
	}
	if _, err := control.LoadPolicy(filepath.Join(t.TempDir(), "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LoadPolicy of a missing file: %v", err)
	}
}

func TestParseRule(t *testing.T) {
	for _, tc := range []struct {
		in, err string
	}{
		{"uid:1000=sandbox-*", ""},
		{"gid:27=a,b,c-*", ""},
		{"group:root=*", ""},
		{"user:root=*", ""},
		{"id:spiffe://example.org/ns/ci/*=ci-*", ""},
		{"id:uri:spiffe://example.org/ns/ci/*=ci-*", ""},
		{"id:dns:builder.example.org=ci-*", ""},
		{"id:cn:sandbox-scheduler=scheduler", ""},
		{"id:sandbox-scheduler=scheduler", "cn:sandbox-scheduler (the subject's common name)"},
		{"uid:x=*", "not a number"},
		{"uid:1000", "want SELECTOR=OWNER"},
		{"pid:1=*", "unknown selector"},
		{"uid:1=a*b", `"*" may only end`},
		{"uid:1=a,rt-victim\u3164", `"uid:1=a,rt-victim\u3164": control policy: owners[1] "rt-victim\u3164": U+3164`},
		{"uid:1=\uff52\uff54-*", `U+FF52, outside ASCII (Ll, Latin)`},
	} {
		_, err := control.ParseRule(tc.in, false)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("ParseRule(%q): %v", tc.in, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseRule(%q): %v, want an error with %q", tc.in, err, tc.err)
		}
	}
}

func TestGrant(t *testing.T) {
	p, err := control.ParsePolicy(strings.NewReader(`{
	  "max_leases": 8,
	  "principals": [
	    {"uid": 1000, "owners": ["sandbox-*"], "max_leases": 100},
	    {"gid": 2000, "owners": ["*"], "read_only": true},
	    {"identity": "spiffe://example.org/ns/ci/*", "owners": ["ci-*", "build"]},
	    {"identity": "cn:sandbox-scheduler", "owners": ["scheduler"]},
	    {"identity": "dns:builder.example.org", "owners": ["dns-*"]}
	  ]}`))
	if err != nil {
		t.Fatal(err)
	}
	const builder = "spiffe://example.org/ns/ci/sa/builder"
	var (
		root      = control.Principal{Kind: control.Unix}
		orch      = control.Principal{Kind: control.Unix, UID: 1000, GID: 1000}
		reader    = control.Principal{Kind: control.Unix, UID: 1500, GID: 100, Groups: []uint32{2000}}
		nobody    = control.Principal{Kind: control.Unix, UID: 65534, GID: 65534}
		ci        = control.Principal{Kind: control.URISAN, Identity: builder}
		other     = control.Principal{Kind: control.URISAN, Identity: "spiffe://example.org/ns/web/sa/x"}
		uid0cert  = control.Principal{Kind: control.CommonName, Identity: "root"}
		cnBuilder = control.Principal{Kind: control.CommonName, Identity: builder}
		dnBuilder = control.Principal{Kind: control.DNSSAN, Identity: builder}
		sched     = control.Principal{Kind: control.CommonName, Identity: "sandbox-scheduler"}
		schedURI  = control.Principal{Kind: control.URISAN, Identity: "sandbox-scheduler"}
		schedDNS  = control.Principal{Kind: control.DNSSAN, Identity: "sandbox-scheduler"}
		dns       = control.Principal{Kind: control.DNSSAN, Identity: "builder.example.org"}
		dnsAsCN   = control.Principal{Kind: control.CommonName, Identity: "builder.example.org"}
	)
	for _, tc := range []struct {
		who         control.Principal
		owner       string
		lease, read bool
		empty       bool
		quota       int
		stringForm  string
	}{
		{root, "anything", true, true, false, 0, "uid:0"},
		{orch, "sandbox-42", true, true, false, 100, "uid:1000"},
		{orch, "ci-1", false, false, false, 100, "uid:1000"},
		{reader, "sandbox-42", false, true, false, 8, "uid:1500"},
		{nobody, "sandbox-42", false, false, true, 8, "uid:65534"},
		{ci, "ci-7", true, true, false, 8, "x509:uri:" + builder},
		{ci, "build", true, true, false, 8, "x509:uri:" + builder},
		{ci, "builder", false, false, false, 8, "x509:uri:" + builder},
		{other, "ci-7", false, false, true, 8, "x509:uri:spiffe://example.org/ns/web/sa/x"},
		// A certificate is never root, whatever it is called.
		{uid0cert, "x", false, false, true, 8, "x509:cn:root"},
		// The builder's SPIFFE ID as a common name or a DNS SAN is
		// another principal, which the URI SAN's rule does not select.
		{cnBuilder, "ci-7", false, false, true, 8, "x509:cn:" + builder},
		{dnBuilder, "ci-7", false, false, true, 8, "x509:dns:" + builder},
		{sched, "scheduler", true, true, false, 8, "x509:cn:sandbox-scheduler"},
		{schedURI, "scheduler", false, false, true, 8, "x509:uri:sandbox-scheduler"},
		{schedDNS, "scheduler", false, false, true, 8, "x509:dns:sandbox-scheduler"},
		{dns, "dns-1", true, true, false, 8, "x509:dns:builder.example.org"},
		{dnsAsCN, "dns-1", false, false, true, 8, "x509:cn:builder.example.org"},
	} {
		g := p.Grant(tc.who)
		if g.MayLease(tc.owner) != tc.lease || g.MayRead(tc.owner) != tc.read || g.Empty() != tc.empty || g.MaxLeases != tc.quota {
			t.Errorf("%s for %q: lease %v read %v empty %v quota %d; want %v %v %v %d", tc.who, tc.owner,
				g.MayLease(tc.owner), g.MayRead(tc.owner), g.Empty(), g.MaxLeases, tc.lease, tc.read, tc.empty, tc.quota)
		}
		if tc.who.String() != tc.stringForm {
			t.Errorf("String() = %q, want %q", tc.who.String(), tc.stringForm)
		}
	}
}

// Attaching a slot to a namespace the caller names is a right of its own:
// leasing for an owner does not give it.
func TestGrantAttach(t *testing.T) {
	p, err := control.ParsePolicy(strings.NewReader(`{"principals": [
	    {"user": "root", "owners": ["sandbox-*"]},
	    {"uid": 1000, "owners": ["cni/*", "sandbox-*"]},
	    {"uid": 1001, "owners": ["cni/pgnet"], "attach": true},
	    {"gid": 3000, "owners": ["cni/*"], "attach": true}
	  ]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		who    control.Principal
		owner  string
		attach bool
	}{
		{control.Principal{Kind: control.Unix}, "cni/anything", true},
		{control.Principal{Kind: control.Unix, UID: 1000, GID: 1000}, "cni/pgnet", false},
		{control.Principal{Kind: control.Unix, UID: 1001, GID: 1001}, "cni/pgnet", true},
		{control.Principal{Kind: control.Unix, UID: 1001, GID: 1001}, "cni/other", false},
		{control.Principal{Kind: control.Unix, UID: 1500, GID: 100, Groups: []uint32{3000}}, "cni/other", true},
		{control.Principal{Kind: control.Unix, UID: 65534, GID: 65534}, "cni/pgnet", false},
		{control.Principal{Kind: control.CommonName, Identity: "root"}, "cni/pgnet", false},
	} {
		if got := p.Grant(tc.who).MayAttach(tc.owner); got != tc.attach {
			t.Errorf("%s may attach for %q: %v, want %v", tc.who, tc.owner, got, tc.attach)
		}
	}
}

// The quota of published host ports: a rule's max_ports, else the
// policy's, else DefaultMaxPorts; root none unless a rule that selects it
// sets one; 0 is none.
func TestGrantMaxPorts(t *testing.T) {
	nobody := control.Principal{Kind: control.Unix, UID: 65534, GID: 65534}
	orchestrator := control.Principal{Kind: control.Unix, UID: 1000, GID: 1000}
	root := control.Principal{Kind: control.Unix}
	rules := `"principals": [{"uid": 65534, "owners": ["b-*"]}, {"uid": 1000, "owners": ["*"], "max_ports": 5000}]`
	for _, tc := range []struct {
		name   string
		policy string
		who    control.Principal
		want   int
	}{
		{"unsaid", `{` + rules + `}`, nobody, control.DefaultMaxPorts},
		{"the policy's", `{"max_ports": 16, ` + rules + `}`, nobody, 16},
		{"none, written", `{"max_ports": 0, ` + rules + `}`, nobody, 0},
		{"a rule's over the policy's", `{"max_ports": 16, ` + rules + `}`, orchestrator, 5000},
		{"root", `{"max_ports": 16, ` + rules + `}`, root, 0},
		{"root, by a rule", `{"principals": [{"uid": 0, "owners": ["*"], "max_ports": 3}]}`, root, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := control.ParsePolicy(strings.NewReader(tc.policy))
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Grant(tc.who).MaxPorts; got != tc.want {
				t.Errorf("MaxPorts of %s = %d, want %d", tc.who, got, tc.want)
			}
		})
	}
}

// The quota of leases of a principal no rule gives one: the policy's
// max_leases when it says one (0: none), and a quarter of the service's
// capacity, at least one, when it does not; root has none unless a rule
// that selects it sets one.
func TestDefaultMaxLeases(t *testing.T) {
	quota := func(n int) *int { return &n }
	var (
		root   = control.Principal{Kind: control.Unix}
		nobody = control.Principal{Kind: control.Unix, UID: 65534, GID: 65534}
		orch   = control.Principal{Kind: control.Unix, UID: 1000, GID: 1000}
	)
	rules := func(t *testing.T) []control.Rule {
		var rs []control.Rule
		for _, s := range []string{"uid:65534=nb-*", "uid:1000=sandbox-*"} {
			r, err := control.ParseRule(s, false)
			if err != nil {
				t.Fatal(err)
			}
			rs = append(rs, r)
		}
		rs[1].MaxLeases = quota(100)
		return rs
	}
	for _, tc := range []struct {
		name      string
		maxLeases *int
		capacity  int
		who       control.Principal
		want      int
	}{
		{"unsaid: a quarter", nil, 16, nobody, 4},
		{"unsaid: a quarter, rounded down", nil, 1023, nobody, 255},
		{"unsaid: at least one", nil, 3, nobody, 1},
		{"unsaid: root has none", nil, 16, root, 0},
		{"unsaid: a rule's own quota", nil, 16, orch, 100},
		{"said", quota(10), 16, nobody, 10},
		{"said above the capacity", quota(64), 16, nobody, 64},
		{"said 0: none", quota(0), 16, nobody, 0},
		{"said: root still has none", quota(10), 16, root, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &control.AccessPolicy{MaxLeases: tc.maxLeases, Rules: rules(t)}
			got := p.WithDefaultMaxLeases(tc.capacity)
			if g := got.Grant(tc.who).MaxLeases; g != tc.want {
				t.Errorf("%s's quota %d, want %d", tc.who, g, tc.want)
			}
			if p.MaxLeases != tc.maxLeases {
				t.Error("WithDefaultMaxLeases changed the policy it was given")
			}
		})
	}
	if got := control.DefaultMaxLeases(1024); got != 256 {
		t.Errorf("DefaultMaxLeases(1024) = %d, want 256", got)
	}
}
