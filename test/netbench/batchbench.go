package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/phasegate/phasegate/network/slot"
)

// sample is one timed request of the concurrent workload.
type sample struct {
	at time.Time
	d  time.Duration
}

// workload is what runs beside a teardown: a slot (netns + veth pair + set
// element) created every 250 ms, as a pool refilling or an Acquire would,
// and a loopback HTTP request every 10 ms, as health checks would.
type workload struct {
	m    *slot.Manager
	next int

	mu       sync.Mutex
	creates  []sample
	http     []sample
	httpErrs int
	errs     []error
}

// newWorkload makes the workload's own slot manager (its own prefix and
// addresses, clear of the benchmark's).
func newWorkload(dir string) (*workload, error) {
	cfg := slot.Config{
		Prefix:   randomPrefix("pw"),
		NetnsDir: dir,
		Slots:    1024,
		CIDR:     netip.MustParsePrefix("169.254.128.0/18"),
	}
	m, err := slot.NewManager(context.Background(), cfg, slot.Options{})
	if err != nil {
		return nil, err
	}
	return &workload{m: m}, nil
}

// run runs the workload until ctx ends.
func (w *workload) run(ctx context.Context) {
	srv := &http.Server{Handler: http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(rw, "ok")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		w.fail(err)
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	defer func() {
		_ = srv.Close()
		wg.Wait()
	}()
	client := &http.Client{Timeout: 5 * time.Second}
	url := "http://" + ln.Addr().String() + "/"
	wg.Go(func() {
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			at := time.Now()
			resp, err := client.Get(url)
			if err == nil {
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			d := time.Since(at)
			w.mu.Lock()
			if err != nil {
				w.httpErrs++
			} else {
				w.http = append(w.http, sample{at, d})
			}
			w.mu.Unlock()
		}
	})
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		w.next++
		at := time.Now()
		_, err := w.m.Create(context.Background(), w.next)
		d := time.Since(at)
		if err != nil {
			w.fail(err)
			continue
		}
		w.mu.Lock()
		w.creates = append(w.creates, sample{at, d})
		w.mu.Unlock()
	}
}

func (w *workload) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.errs = append(w.errs, err)
}

// between returns the durations of the samples that started in [from, to).
func between(ss []sample, from, to time.Time) []time.Duration {
	var out []time.Duration
	for _, s := range ss {
		if !s.at.Before(from) && s.at.Before(to) {
			out = append(out, s.d)
		}
	}
	return out
}

// reset tears down the workload's slots and forgets its samples.
func (w *workload) reset() error {
	res := w.m.Teardown(context.Background(), slot.Assume(seq(1, w.next)...), slot.TeardownOptions{})
	w.next = 0
	w.mu.Lock()
	defer w.mu.Unlock()
	w.creates, w.http, w.httpErrs = nil, nil, 0
	err := errors.Join(append(w.errs, res.Err())...)
	w.errs = nil
	return err
}

func (w *workload) sweep() {
	if err := sweep(w.m.Config()); err != nil {
		fmt.Fprintln(os.Stderr, "netbench: sweep workload:", err)
	}
}

// batchRow is one teardown of N leaked slots with a given batch size.
type batchRow struct {
	label    string
	batch    int
	pause    time.Duration
	total    time.Duration
	res      *slot.TeardownResult
	creates  []time.Duration
	http     []time.Duration
	httpErrs int
}

// batchBench leaks n slots and tears them down with each batch size in
// turn (0: all at once), while the workload runs; first the workload alone.
func (b *bench) batchBench(n int, batches []batchSpec, reps int) (idle batchRow, rows []batchRow, err error) {
	w, err := newWorkload(b.dir)
	if err != nil {
		return idle, nil, err
	}
	defer w.sweep()
	measure := func(during func() (*slot.TeardownResult, error)) (batchRow, error) {
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { w.run(ctx) })
		time.Sleep(500 * time.Millisecond)
		t0 := time.Now()
		res, err := during()
		t1 := time.Now()
		cancel()
		wg.Wait()
		row := batchRow{total: t1.Sub(t0), res: res}
		w.mu.Lock()
		row.creates, row.http, row.httpErrs = between(w.creates, t0, t1), between(w.http, t0, t1), w.httpErrs
		w.mu.Unlock()
		return row, errors.Join(err, w.reset())
	}
	fmt.Fprintln(os.Stderr, "batches: workload alone...")
	idle, err = measure(func() (*slot.TeardownResult, error) {
		time.Sleep(5 * time.Second)
		return nil, nil
	})
	if err != nil {
		return idle, nil, err
	}
	if err := b.settle(); err != nil {
		return idle, nil, err
	}
	for rep := range reps {
		for _, spec := range batches {
			k, pause := spec.k, spec.pause
			fmt.Fprintf(os.Stderr, "batches: rep %d, leak %d for batch %d, pause %v...\n", rep+1, n, k, pause)
			if _, err := b.leak(n); err != nil {
				return idle, rows, err
			}
			time.Sleep(2 * time.Second)
			row, err := measure(func() (*slot.TeardownResult, error) {
				res := b.m.Teardown(context.Background(), slot.Assume(seq(1, n)...), slot.TeardownOptions{Batch: k, BatchPause: pause})
				if len(res.Reclaimed) != n {
					return res, fmt.Errorf("batch %d: %v (%v)", k, res, res.Err())
				}
				return res, nil
			})
			row.batch, row.pause = k, pause
			row.label = "all"
			if k > 0 {
				row.label = fmt.Sprint(k)
			}
			fmt.Fprintf(os.Stderr, "  batch %s: %v (unlink %v, wait %v, firewall %v, %d batches); creates %d, max %v; http p99 %v\n",
				row.label, row.total, row.res.Timings.Unlink, row.res.Timings.Wait, row.res.Timings.Firewall, row.res.Batches,
				len(row.creates), pct0(row.creates, 1), pct0(row.http, 0.99))
			rows = append(rows, row)
			if err != nil {
				return idle, rows, err
			}
			if err := b.settle(); err != nil {
				return idle, rows, err
			}
		}
	}
	return idle, rows, nil
}

// pct0 is pct that answers 0 for no samples.
func pct0(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return pct(ds, p)
}

func count(ds []time.Duration, over time.Duration) int {
	n := 0
	for _, d := range ds {
		if d > over {
			n++
		}
	}
	return n
}

func (r *results) batchMarkdown(n int, idle batchRow, rows []batchRow) string {
	var b strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	w("# Teardown in batches\n\n")
	w("Measured by `test/netbench -mode batches` on the real kernel, as root, in one run. Reproduce with:\n\n")
	w("```sh\n# as root, from the repository root\n%s\n```\n\n", r.cmd)
	w("Machine: Linux %s, %s, %s. Load average at start %s, at end %s.\n\n", r.kernel, r.cpu, r.goVersion, r.loadStart, r.loadEnd)
	w("Each row leaks %d full slots (netns + veth pair + set element) and tears them down with `slot.Manager.Teardown`\n"+
		"(16 workers) handing the kernel the dead namespaces in batches of the given size (all: one batch), while a\n"+
		"workload runs beside it: a new slot (netns + veth pair + addresses + set element, `Manager.Create`, another\n"+
		"prefix) every 250 ms, and a loopback HTTP GET every 10 ms to a server in the same process. **total** is\n"+
		"Teardown's wall time (it returns when every host link is gone and every element removed). Latencies count the\n"+
		"requests started during the teardown.\n\n", n)
	w("| batch | total | unlink | wait | firewall | batches | creates | create p50 | create max | creates > 100 ms | HTTP p50 | HTTP p99 | HTTP max | HTTP errors |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	row := func(label string, x batchRow) {
		unlink, wait, fw, batches := "–", "–", "–", "–"
		if x.res != nil {
			unlink, wait, fw, batches = ms(x.res.Timings.Unlink), ms(x.res.Timings.Wait), ms(x.res.Timings.Firewall), fmt.Sprint(x.res.Batches)
		}
		w("| %s | %s | %s | %s | %s | %s | %d | %s | %s | %d | %s | %s | %s | %d |\n", label, ms(x.total), unlink, wait, fw, batches,
			len(x.creates), ms(pct0(x.creates, 0.5)), ms(pct0(x.creates, 1)), count(x.creates, 100*time.Millisecond),
			ms(pct0(x.http, 0.5)), ms(pct0(x.http, 0.99)), ms(pct0(x.http, 1)), x.httpErrs)
	}
	row("idle (no teardown, 5 s)", idle)
	for _, x := range rows {
		label := x.label
		if x.pause > 0 {
			label += fmt.Sprintf(", pause %v", x.pause)
		}
		row(label, x)
	}
	w("\nEvery create latency during each teardown (ms, in order):\n\n")
	for _, x := range rows {
		w("- batch %s: %s\n", x.label, msList(x.creates))
	}
	return b.String()
}
