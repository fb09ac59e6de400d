package main

import (
	"flag"
	"strings"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/control"
	"github.com/phasegate/phasegate/phases"
)

// controlFlags are serve's settings of the control surface: where the
// socket is, who may connect, and what each principal may do.
type controlFlags struct {
	socket, group, policyFile string
	allow, allowRead, attach  rulesValue
	maxLeases                 int
	rate                      float64
}

func (f *controlFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.socket, "control-socket", "", "path of the control socket, where the Slots API is served (default <state-dir>/"+phases.ControlSocketName+")")
	fs.StringVar(&f.group, "control-group", "", "group (name or number) whose members may connect to the control socket (mode 0660); without it only root may")
	fs.StringVar(&f.policyFile, "control-policy", "", "JSON file of what each principal may do on the control surface (docs/SECURITY.md)")
	f.allowRead.readOnly = true
	fs.Var(&f.allow, "allow", "SELECTOR=OWNER,…: let principals lease for these owners (exact, or a prefix ending in *); SELECTOR is uid:N, user:NAME, gid:N, group:NAME or id:KIND:IDENTITY (a client certificate: id:uri:…, id:dns:…, id:cn:…, or id:spiffe://… for a URI SAN); repeatable")
	fs.Var(&f.allowRead, "allow-read", "SELECTOR=OWNER,…: let principals see these owners' leases, nothing more; repeatable")
	f.attach.attach = true
	fs.Var(&f.attach, "allow-attach", "SELECTOR=OWNER,…: let principals lease for these owners and attach their slots to network namespaces they could enter themselves (the CNI plugin; owner cni/<network>); root may without it; repeatable")
	fs.IntVar(&f.maxLeases, "max-leases", 0, "leases one principal may hold at once, unless the policy says otherwise (unset: a quarter of --slots; 0: no limit but --slots); root has none unless a rule sets one")
	fs.Float64Var(&f.rate, "control-rate", control.DefaultRate, "calls a second one principal may make on the control surface, in bursts of twice that: a finite number, 0 or more (0: no limit)")
}

// config resolves the flags into the daemon's ControlConfig: the policy
// file first (read through files), then the rules and limits given as
// flags. Unknown users and groups, and a policy that does not parse, are
// refused here.
func (f *controlFlags) config(fs *flag.FlagSet, files *app.ConfigFiles) (phases.ControlConfig, error) {
	cc := phases.ControlConfig{Socket: f.socket, GID: -1}
	if f.group != "" {
		gid, err := control.LookupGroup(f.group)
		if err != nil {
			return cc, err
		}
		cc.GID = gid
	}
	p := &control.AccessPolicy{Rate: control.DefaultRate}
	if f.policyFile != "" {
		b, err := files.ReadFile(f.policyFile, control.ReadPolicyFile)
		if err != nil {
			return cc, err
		}
		if p, err = control.ParsePolicyFile(f.policyFile, b); err != nil {
			return cc, err
		}
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	// Unset here and in the file, the quota is the daemon's default
	// share of its slots (phases.Config.ControlPolicy).
	if set["max-leases"] {
		p.MaxLeases = &f.maxLeases
	}
	if set["control-rate"] || f.policyFile == "" {
		p.Rate = f.rate
	}
	p.Rules = append(append(append(p.Rules, f.allow.rules...), f.allowRead.rules...), f.attach.rules...)
	if err := p.Resolve(); err != nil {
		return cc, err
	}
	cc.Policy = p
	return cc, nil
}

// rulesValue is a repeatable flag of policy rules.
type rulesValue struct {
	rules            []control.Rule
	readOnly, attach bool
	texts            []string
}

func (v *rulesValue) String() string { return strings.Join(v.texts, " ") }

func (v *rulesValue) Set(s string) error {
	r, err := control.ParseRule(s, v.readOnly)
	if err != nil {
		return err
	}
	r.Attach = v.attach
	v.rules, v.texts = append(v.rules, r), append(v.texts, s)
	return nil
}
