package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/phasegate/phasegate/lifecycle"
	"github.com/phasegate/phasegate/server"
)

// worker is what the phases share. lc and srv are set once the App exists,
// before it starts.
type worker struct {
	queue  string
	client *http.Client
	lc     *lifecycle.Lifecycle
	srv    *server.Server

	processed atomic.Int64
}

// Bounds of the job loop's waits.
const (
	idlePoll   = 50 * time.Millisecond // the queue had no job
	maxBackoff = 2 * time.Second       // the queue could not be reached
	reportTime = 10 * time.Second      // posting a finished job's result
)

// warnQueue names the warning the worker sets while it cannot reach the
// queue after the start.
const warnQueue = "queue"

// RouteStats serves the worker's counters, once it serves.
const RouteStats = "GET /v1/stats"

// waitForQueue is one attempt to reach the queue; the phase's retry policy
// repeats it with backoff until it succeeds, and health says meanwhile
// which phase the worker waits in and for what.
func (w *worker) waitForQueue(ctx context.Context, p *lifecycle.Progress) error {
	p.SetMessage("waiting for " + w.queue)
	if _, err := w.call(ctx, http.MethodGet, "/healthz", nil); err != nil {
		return fmt.Errorf("waiting for %s: %w", w.queue, err)
	}
	return nil
}

// consume hands the job loop to the lifecycle, which starts it once this
// phase has succeeded, cancels it when the worker drains and waits for it
// to return; and binds the stats route.
func (w *worker) consume(_ context.Context, p *lifecycle.Progress) error {
	p.Defer("jobs", w.processJobs)
	return w.srv.BindHTTP(RouteStats, w.statsHandler())
}

// statsHandler serves the worker's counters.
func (w *worker) statsHandler() http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(map[string]int64{"processed": w.processed.Load()})
	})
}

// processJobs takes jobs until ctx ends. A job it took is finished and
// reported even when the drain begins meanwhile. While the queue cannot
// be reached it retries with backoff, under a warning that health shows.
func (w *worker) processJobs(ctx context.Context, p *lifecycle.Progress) error {
	p.SetTotal(0, "jobs")
	backoff := idlePoll
	for {
		job, err := w.next(ctx)
		switch {
		case ctx.Err() != nil:
			return nil // drained: an orderly end
		case err != nil:
			w.lc.Warn(warnQueue, fmt.Sprintf("cannot reach %s, retrying: %v", w.queue, err))
			backoff = min(2*backoff, maxBackoff)
			sleep(ctx, backoff)
			continue
		}
		w.lc.ClearWarning(warnQueue)
		backoff = idlePoll
		if job == nil {
			sleep(ctx, idlePoll)
			continue
		}
		res, err := json.Marshal(process(job))
		if err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportTime)
		_, err = w.call(rctx, http.MethodPost, "/jobs/"+job.ID+"/result", res)
		cancel()
		if err != nil {
			// The queue hands the job out again after its own timeout.
			w.lc.Warn(warnQueue, fmt.Sprintf("job %s: result not recorded: %v", job.ID, err))
			continue
		}
		w.processed.Add(1)
		p.Add(1)
	}
}

// process is the work itself.
func process(j *Job) Result {
	sum := sha256.Sum256([]byte(j.Text))
	return Result{Words: len(strings.Fields(j.Text)), SHA256: hex.EncodeToString(sum[:])}
}

// next takes the next job, or returns nil when there is none.
func (w *worker) next(ctx context.Context) (*Job, error) {
	body, err := w.call(ctx, http.MethodGet, "/jobs/next", nil)
	if err != nil || body == nil {
		return nil, err
	}
	var j Job
	if err := json.Unmarshal(body, &j); err != nil {
		return nil, fmt.Errorf("a job that is not JSON: %w", err)
	}
	return &j, nil
}

// call makes a request to the queue and returns the body of a 200, nil for
// a 204, and an error for anything else.
func (w *worker) call(ctx context.Context, method, path string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, w.queue+path, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	resp, err := w.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case err != nil:
		return nil, err
	case resp.StatusCode == http.StatusNoContent:
		return nil, nil
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("%s %s: %s", method, path, resp.Status)
	}
	return b, nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
