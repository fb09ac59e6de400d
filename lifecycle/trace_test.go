package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/phasegate/phasegate/lifecycle"
)

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

func byName(spans []sdktrace.ReadOnlySpan) map[string]sdktrace.ReadOnlySpan {
	m := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		m[s.Name()] = s
	}
	return m
}

func TestSpanTree(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()

	calls := 0
	taskDone := make(chan struct{})
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop, Stop: func(context.Context) error { return nil }},
		{Name: "reclaim", DependsOn: []string{"lock"}, Retry: lifecycle.RetryPolicy{Attempts: 2, Backoff: time.Millisecond},
			Run: func(ctx context.Context, p *lifecycle.Progress) error {
				if calls++; calls == 1 {
					return errors.New("EBUSY")
				}
				p.SetTotal(10, "namespaces")
				p.Add(10)
				p.Defer("reclaim-rest", func(context.Context, *lifecycle.Progress) error { close(taskDone); return nil })
				return nil
			},
			Stop: func(context.Context) error { return errors.New("unmount failed") },
		},
	}, lifecycle.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	<-taskDone
	if err := lc.Drain(context.Background()); err == nil {
		t.Fatal("Drain hid the stop error")
	}

	spans := byName(rec.Ended())
	for _, name := range []string{"startup", "phase lock", "phase reclaim", "task reclaim-rest", "drain", "stop lock", "stop reclaim"} {
		if _, ok := spans[name]; !ok {
			t.Fatalf("no span %q among %v", name, spans)
		}
	}
	root := spans["startup"]
	if root.Parent().IsValid() {
		t.Error("startup is not a root span")
	}
	for _, name := range []string{"phase lock", "phase reclaim"} {
		s := spans[name]
		if s.Parent().SpanID() != root.SpanContext().SpanID() || s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("%s is not a child of startup", name)
		}
	}
	checkRetriedPhaseSpan(t, spans["phase reclaim"])
	checkTaskAndStopSpans(t, spans)
}

// checkRetriedPhaseSpan checks the span of the phase reclaim, which
// succeeded at its second attempt: its attributes and its retry event.
func checkRetriedPhaseSpan(t *testing.T, reclaim sdktrace.ReadOnlySpan) {
	t.Helper()
	rc := attrs(reclaim)
	if rc["phasegate.phase"].AsString() != "reclaim" || rc["phasegate.phase.attempts"].AsInt64() != 2 ||
		rc["phasegate.progress.done"].AsInt64() != 10 || rc["phasegate.progress.total"].AsInt64() != 10 ||
		rc["phasegate.outcome"].AsString() != "succeeded" ||
		len(rc["phasegate.phase.depends_on"].AsStringSlice()) != 1 {
		t.Errorf("phase reclaim attributes %v", rc)
	}
	ev := reclaim.Events()
	if len(ev) != 1 || ev[0].Name != "retry" {
		t.Fatalf("phase reclaim events %v, want one retry", ev)
	}
	evAttrs := map[attribute.Key]attribute.Value{}
	for _, kv := range ev[0].Attributes {
		evAttrs[kv.Key] = kv.Value
	}
	if evAttrs["error.message"].AsString() != "EBUSY" || evAttrs["phasegate.attempt"].AsInt64() != 1 || evAttrs["phasegate.backoff"].AsString() == "" {
		t.Errorf("retry event attributes %v", evAttrs)
	}
}

// checkTaskAndStopSpans checks that the background task's span is a root
// linked to the phase that deferred it, and that the stops are children of
// the drain, in reverse order of the phases, with the failed one an error.
func checkTaskAndStopSpans(t *testing.T, spans map[string]sdktrace.ReadOnlySpan) {
	t.Helper()
	task := spans["task reclaim-rest"]
	if task.Parent().IsValid() {
		t.Error("a background task's span has a parent; it should be a linked root")
	}
	if l := task.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != spans["phase reclaim"].SpanContext().SpanID() {
		t.Errorf("task links %v, want one to phase reclaim", l)
	}

	drain := spans["drain"]
	for _, name := range []string{"stop lock", "stop reclaim"} {
		if spans[name].Parent().SpanID() != drain.SpanContext().SpanID() {
			t.Errorf("%s is not a child of drain", name)
		}
	}
	if spans["stop reclaim"].Status().Code != codes.Error || drain.Status().Code != codes.Error {
		t.Errorf("failed stop not recorded as an error: %v / %v", spans["stop reclaim"].Status(), drain.Status())
	}
	if spans["stop reclaim"].EndTime().After(spans["stop lock"].StartTime()) {
		t.Error("reclaim was stopped after lock, which it depends on")
	}
}

func TestSpanTreeOnFailure(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	lc, err := lifecycle.New([]lifecycle.Phase{
		{Name: "lock", Run: nop, Stop: func(context.Context) error { return nil }},
		{Name: "storage", DependsOn: []string{"lock"}, Run: func(context.Context, *lifecycle.Progress) error {
			return errors.New("disk full")
		}},
		{Name: "serve", DependsOn: []string{"storage"}, Run: nop},
	}, lifecycle.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err == nil {
		t.Fatal("Start succeeded")
	}
	spans := byName(rec.Ended())
	if _, ok := spans["phase serve"]; ok {
		t.Error("a skipped phase has a span")
	}
	st := spans["phase storage"]
	if st.Status().Code != codes.Error || st.Status().Description != "disk full" || attrs(st)["phasegate.outcome"].AsString() != "failed" {
		t.Errorf("phase storage status %v attrs %v", st.Status(), attrs(st))
	}
	if len(st.Events()) == 0 || st.Events()[len(st.Events())-1].Name != "exception" {
		t.Errorf("phase storage did not record its error as an event: %v", st.Events())
	}
	root := spans["startup"]
	if root.Status().Code != codes.Error || attrs(root)["phasegate.outcome"].AsString() != "failed" {
		t.Errorf("startup status %v", root.Status())
	}
	rb := spans["rollback"]
	if rb == nil || rb.Parent().SpanID() != root.SpanContext().SpanID() {
		t.Fatal("no rollback span under startup")
	}
	if spans["stop lock"].Parent().SpanID() != rb.SpanContext().SpanID() {
		t.Error("stop lock is not under rollback")
	}
}

// WithSpanAttributes adds what the caller knows of a phase, a task and
// the start to their spans as they end, with how long each ran, a phase's
// retries included.
func TestSpanAttributes(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	n := 0
	var mu sync.Mutex
	took := map[string]time.Duration{}
	lc, err := lifecycle.New([]lifecycle.Phase{{Name: "registry", Retry: lifecycle.RetryPolicy{Attempts: 2, Backoff: 20 * time.Millisecond},
		Run: func(_ context.Context, p *lifecycle.Progress) error {
			if n++; n == 1 {
				return errors.New("refused")
			}
			p.Defer("warm", func(context.Context, *lifecycle.Progress) error {
				time.Sleep(10 * time.Millisecond)
				return nil
			})
			return nil
		}}},
		lifecycle.WithTracerProvider(tp),
		lifecycle.WithSpanAttributes(func(e lifecycle.SpanEnd) []attribute.KeyValue {
			mu.Lock()
			defer mu.Unlock()
			took[fmt.Sprint(e.Name, e.Task)] = e.Took
			return []attribute.KeyValue{attribute.String("usual", fmt.Sprintf("usually 3ms for %q (task %v)", e.Name, e.Task))}
		}))
	if err != nil {
		t.Fatal(err)
	}
	if err := lc.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := lc.Drain(context.Background()); err != nil { // waits for the task
		t.Fatal(err)
	}
	spans := byName(rec.Ended())
	for span, want := range map[string]string{
		"phase registry": `usually 3ms for "registry" (task false)`,
		"task warm":      `usually 3ms for "warm" (task true)`,
		"startup":        `usually 3ms for "" (task false)`,
	} {
		sp, ok := spans[span]
		if !ok {
			t.Errorf("no span %q", span)
			continue
		}
		if got := attrs(sp)["usual"].AsString(); got != want {
			t.Errorf("span %q: the attribute is %q, want %q", span, got, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if ran := took["registryfalse"]; ran < 20*time.Millisecond {
		t.Errorf("the phase took %v, want the whole phase with its 20ms backoff", ran)
	}
	if ran := took["warmtrue"]; ran < 10*time.Millisecond {
		t.Errorf("the task took %v, want its 10ms", ran)
	}
	if ran := took["false"]; ran < took["registryfalse"] {
		t.Errorf("the start took %v, less than its phase's %v", ran, took["registryfalse"])
	}
}
