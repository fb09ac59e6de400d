// Command worker processes jobs from a queue, and gates its startup on the
// queue being reachable: until it is, the worker's port answers health
// checks with 503 and the reason, "starting: phase queue retrying after
// attempt 3: waiting for http://127.0.0.1:9000: … connection refused", and
// retries with a capped, jittered backoff; once it is, a background task
// takes jobs, counts each one's words and hashes it, and posts the result
// back.
//
//	queue ──► consume ──┐
//	listen ─────────────┴──► serve      (consume defers the task "jobs")
//
// Run it against a queue that speaks the protocol in queue.go:
//
//	go run ./worker -listen 127.0.0.1:7001 -queue http://127.0.0.1:9000
//
//	curl 127.0.0.1:7001/health?pretty   # 503 "phase queue … waiting for …", then 200
//	curl 127.0.0.1:7001/v1/stats        # jobs processed, once serving
//
// If the queue goes away after the start, the worker keeps serving with a
// warning ("warn" in /health, "serving; 1 warning: queue: …") and keeps
// retrying; SIGINT or SIGTERM lets the job in hand finish and report
// before the process exits.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"time"

	"github.com/phasegate/phasegate/app"
	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/metrics/prometheus"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:7001", "the address of the port for health, metrics and stats")
	queue := flag.String("queue", "http://127.0.0.1:9000", "the base URL of the job queue")
	flag.Parse()
	cfg := app.DefaultConfig("worker", *listen)
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	cfg.MetricExporters = []metrics.Exporter{prometheus.Exporter()} // /metrics
	a, err := newWorker(cfg, *queue)
	if err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(2)
	}
	os.Exit(a.Main())
}

// newWorker declares the worker's phases and its stats route.
func newWorker(cfg app.Config, queue string) (*app.App, error) {
	w := &worker{queue: queue, client: &http.Client{Timeout: 5 * time.Second}}
	a, err := app.New(cfg,
		lifecycle.Phase{Name: "queue", Run: w.waitForQueue, Retry: lifecycle.RetryPolicy{
			Attempts: math.MaxInt, // the whole start's timeout bounds the wait
			Backoff:  100 * time.Millisecond, MaxBackoff: 2 * time.Second, Jitter: 0.2,
		}},
		lifecycle.Phase{Name: "consume", DependsOn: []string{"queue"}, Run: w.consume},
	)
	if err != nil {
		return nil, err
	}
	w.lc, w.srv = a.Lifecycle(), a.Server()
	if err := w.srv.DeclareHTTP(RouteStats); err != nil {
		_ = a.Stop(context.Background()) // New started the health observers
		return nil, err
	}
	return a, nil
}
