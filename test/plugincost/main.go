// Command plugincost measures what a CNI plugin's exec costs by what it
// links: a runtime execs the plugin once per call, so the packages it
// imports are paid at every ADD and DEL. It builds the variants under
// variants/ (nothing; the CNI library's types without its skel; skel and
// types with net, which the plugin links; those and net/http; those and a
// grpc-go client) and execs
// each -n times, interleaved, from exec to exit, and prints p50 and p99 as
// a Markdown table (docs/BENCHMARKS.md, "The CNI plugin's exec cost").
//
//	cd test && go run ./plugincost -n 400
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"
)

// variants are the packages under variants/, cheapest first.
var variants = []string{"empty", "noskel", "cni", "nethttp", "grpc"}

func main() {
	n := flag.Int("n", 300, "execs of each variant")
	flag.Parse()
	dir, err := os.MkdirTemp("", "plugincost-")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	bins := make([]string, len(variants))
	for i, v := range variants {
		bins[i] = filepath.Join(dir, v)
		if out, err := exec.Command("go", "build", "-trimpath", "-o", bins[i], "./plugincost/variants/"+v).CombinedOutput(); err != nil {
			log.Fatalf("build %s: %v\n%s", v, err, out)
		}
	}
	took := make([][]time.Duration, len(bins))
	for range *n {
		for i, b := range bins {
			start := time.Now()
			if err := exec.Command(b).Run(); err != nil {
				log.Fatalf("%s: %v", variants[i], err)
			}
			took[i] = append(took[i], time.Since(start))
		}
	}
	fmt.Println("| variant | binary | exec → exit p50 | p99 |")
	fmt.Println("|---|---:|---:|---:|")
	for i, b := range bins {
		st, err := os.Stat(b)
		if err != nil {
			log.Fatal(err)
		}
		slices.Sort(took[i])
		fmt.Printf("| %s | %.1f MB | %.1f ms | %.1f ms |\n", variants[i], float64(st.Size())/1e6, ms(took[i][*n/2]), ms(took[i][*n*99/100]))
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
