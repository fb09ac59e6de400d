package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
)

// envName is the environment variable that sets a flag: --pool-min-ready is
// PHASEGATE_POOL_MIN_READY.
func envName(flagName string) string {
	return "PHASEGATE_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags parses args, then sets every flag the command line left alone
// from its PHASEGATE_* variable: flags win over the environment. Every bad
// value is reported, joined.
func parseFlags(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) error {
	if err := parseFlagsKeepArgs(fs, args, lookupEnv); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// parseCommand parses the flags of a command run as synopsis (parseFlags):
// -h prints its usage and a bad flag one line; done says the command ends
// there, with code.
func (e env) parseCommand(fs *flag.FlagSet, synopsis string) (code int, done bool) {
	err := parseFlags(fs, e.args, e.lookupEnv)
	switch {
	case err == nil:
		return 0, false
	case errors.Is(err, flag.ErrHelp):
		usage(e.stdout, fs, synopsis)
		return exitOK, true
	}
	fmt.Fprintf(e.stderr, "phasegate %s: %s\n", fs.Name(), oneLine(err))
	return exitUsage, true
}

// parseFlagsKeepArgs is parseFlags for a command that takes arguments
// after its flags: they are left in fs.Args().
func parseFlagsKeepArgs(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) error {
	fs.SetOutput(io.Discard) // errors are returned and printed as one line
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		v, ok := lookupEnv(envName(f.Name))
		if !ok {
			return
		}
		// Through the set, so that a flag set from the environment counts
		// as given (fs.Visit): --max-leases unset is not --max-leases=0.
		if err := fs.Set(f.Name, v); err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: %v", envName(f.Name), v, err))
		}
	})
	return errors.Join(errs...)
}

// parsedValue is a flag.Value that parse sets and show prints: "" while
// unset, as flag's help prints a default of nothing.
type parsedValue[T any] struct {
	p     *T
	parse func(string) (T, error)
	show  func(T) string
}

func (v parsedValue[T]) String() string {
	if v.p == nil {
		return ""
	}
	return v.show(*v.p)
}

func (v parsedValue[T]) Set(s string) error {
	x, err := v.parse(s)
	if err != nil {
		return err
	}
	*v.p = x
	return nil
}

// showValid prints x, or "" when it is not valid (netip's zero values).
func showValid[T interface {
	IsValid() bool
	String() string
}](x T) string {
	if !x.IsValid() {
		return ""
	}
	return x.String()
}

// parsing is parse with its error replaced by one saying what s is not
// (the parsers' own errors name the Go type, not the flag's meaning).
func parsing[T any](parse func(string) (T, error), what string) func(string) (T, error) {
	return func(s string) (T, error) {
		x, err := parse(s)
		if err != nil {
			return x, fmt.Errorf("not %s: %q", what, s)
		}
		return x, nil
	}
}

// prefixValue is a CIDR prefix, with no host bits set.
func prefixValue(p *netip.Prefix) parsedValue[netip.Prefix] {
	return parsedValue[netip.Prefix]{p: p, show: showValid[netip.Prefix], parse: func(s string) (netip.Prefix, error) {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("not a CIDR prefix: %q", s)
		}
		if p != p.Masked() {
			return p, fmt.Errorf("%s has host bits set; did you mean %s?", s, p.Masked())
		}
		return p, nil
	}}
}

// choiceValue is a flag.Value restricted to a few words.
type choiceValue struct {
	v       *string
	choices []string
}

func (c choiceValue) String() string {
	if c.v == nil {
		return ""
	}
	return *c.v
}

func (c choiceValue) Set(s string) error {
	for _, ok := range c.choices {
		if s == ok {
			*c.v = s
			return nil
		}
	}
	return fmt.Errorf("want one of %s", strings.Join(c.choices, ", "))
}

// usage renders a command's synopsis and flags for -h.
func usage(w io.Writer, fs *flag.FlagSet, synopsis string) {
	fmt.Fprintf(w, "usage: phasegate %s\n\nflags (each also read from PHASEGATE_<FLAG>, flags win):\n", synopsis)
	fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
			def = " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "  --%-22s %s%s\n", f.Name, f.Usage, def)
	})
}

// portsValue is a flag.Value for a comma-separated list of ports.
type portsValue struct{ p *[]uint16 }

func (v portsValue) String() string {
	if v.p == nil {
		return ""
	}
	parts := make([]string, len(*v.p))
	for i, p := range *v.p {
		parts[i] = strconv.Itoa(int(p))
	}
	return strings.Join(parts, ",")
}

func (v portsValue) Set(s string) error {
	var out []uint16
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("%q is not a port (1-65535)", f)
		}
		out = append(out, uint16(n))
	}
	*v.p = out
	return nil
}

// verbs are the verbs of a command that takes one (slots, held), each
// with its number of arguments.
type verbs struct {
	command, usage string
	args           map[string]int
}

// parseOrExit is parse for a command: done when the command ends there,
// with the code to exit with (0 when the help was printed, 2 with the
// usage error printed).
func (v verbs) parseOrExit(fs *flag.FlagSet, e env, args []string) (verb string, pos []string, code int, done bool) {
	verb, pos, err := v.parse(fs, e, args)
	switch {
	case errors.Is(err, errShownHelp):
		return "", nil, exitOK, true
	case err != nil:
		fmt.Fprintf(e.stderr, "%s\n", err)
		return "", nil, exitUsage, true
	}
	return verb, pos, 0, false
}

// parse reads the verb, its arguments and the flags, which may come
// before or after the arguments. The error is the line to print;
// errShownHelp when the help was printed.
func (v verbs) parse(fs *flag.FlagSet, e env, args []string) (verb string, pos []string, err error) {
	badUsage := fmt.Errorf("usage: phasegate %s", v.usage)
	if len(args) == 0 {
		return "", nil, badUsage
	}
	if isHelp(args[0]) {
		usage(e.stdout, fs, v.usage)
		return "", nil, errShownHelp
	}
	verb, rest := args[0], args[1:]
	// At least once, with no argument left too: the parse is also what
	// sets the flags the command line left alone from the environment
	// (PHASEGATE_SOCKET for "slots list").
	for first := true; first || len(rest) > 0; first = false {
		if err := parseFlagsKeepArgs(fs, rest, e.lookupEnv); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				usage(e.stdout, fs, v.usage)
				return "", nil, errShownHelp
			}
			return "", nil, fmt.Errorf("phasegate %s: %s", v.command, oneLine(err))
		}
		rest = fs.Args()
		if len(rest) > 0 {
			pos, rest = append(pos, rest[0]), rest[1:]
		}
	}
	if n, ok := v.args[verb]; !ok || len(pos) != n {
		return "", nil, badUsage
	}
	return verb, pos, nil
}
