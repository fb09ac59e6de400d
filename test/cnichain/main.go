// Command cnichain measures a CNI ADD and DEL that publish ports and limit
// bandwidth, called through libcni as podman and containerd call a
// network: phasegate-cni doing both itself (the portMappings and
// bandwidth capabilities), beside phasegate-cni chained with the reference
// portmap and bandwidth plugins, Debian's, which is what a conflist had to
// do before (docs/BENCHMARKS.md, "CNI with published ports and a bandwidth
// limit").
//
// Everything runs in a network namespace of its own that plays the node:
// the daemon, its slots' host ends, the reference plugins' iptables chains
// and ifb devices. Deleting that namespace at the end leaves nothing on
// the machine, whatever a plugin left behind.
//
//	cd test && go run ./cnichain -containers 20 -reps 3
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"time"
)

func main() {
	o := options{}
	flag.IntVar(&o.containers, "containers", 20, "containers attached one after another, per side and rep")
	flag.IntVar(&o.reps, "reps", 3, "repetitions, each with a fresh daemon; the sides' order turns from rep to rep")
	flag.StringVar(&o.refDir, "ref-plugins", "/usr/lib/cni", "directory of the reference portmap and bandwidth plugins")
	flag.Parse()
	if err := run(context.Background(), o); err != nil {
		log.Fatal(err)
	}
}

// options are the command's flags.
type options struct {
	containers, reps int
	refDir           string
}

// run builds the binaries, makes the node, measures each rep and prints
// the table.
func run(ctx context.Context, o options) error {
	dir, err := os.MkdirTemp("", "cnichain-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	n, err := newNode(ctx, dir, o.containers)
	if err != nil {
		return err
	}
	defer n.close()
	got := map[string]*side{}
	for _, s := range sides {
		got[s.name] = &side{}
	}
	for rep := range o.reps {
		if err := n.rep(ctx, rep, o, got); err != nil {
			return fmt.Errorf("rep %d: %w", rep+1, err)
		}
	}
	printTable(o, got)
	return nil
}

// side is one conflist's timings, every rep's.
type side struct{ add, del []time.Duration }

// printTable prints p50 and p99 of each side, and the ratio of
// phasegate-cni alone to the chain, as Markdown.
func printTable(o options, got map[string]*side) {
	fmt.Printf("%d containers one after another, %d reps, libcni in one process\n\n", o.containers, o.reps)
	fmt.Println("| conflist | ADD p50 | ADD p99 | DEL p50 | DEL p99 |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, s := range sides {
		g := got[s.name]
		fmt.Printf("| %s | %.1f ms | %.1f ms | %.1f ms | %.1f ms |\n", s.name, pct(g.add, 50), pct(g.add, 99), pct(g.del, 50), pct(g.del, 99))
	}
	own, chain := got[sides[0].name], got[sides[1].name]
	fmt.Printf("\nADD p50: %.2f× the chain's; DEL p50: %.2f×\n", pct(own.add, 50)/pct(chain.add, 50), pct(own.del, 50)/pct(chain.del, 50))
}

// pct is the p-th percentile of ds, in milliseconds.
func pct(ds []time.Duration, p int) float64 {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := min(len(s)-1, len(s)*p/100)
	return float64(s[i].Microseconds()) / 1000
}

// binDir is where the built binaries go, beside the daemon's state.
func binDir(dir string) string { return filepath.Join(dir, "bin") }
