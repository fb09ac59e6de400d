package export

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"

	"github.com/phasegate/phasegate/internal/otelsdk"
	"github.com/phasegate/phasegate/metrics"
	"github.com/phasegate/phasegate/tracing/grpccalls"
)

// Push returns the exporter called name (its name in
// OTEL_METRICS_EXPORTER, lower case) that pushes to the SDK exporter open
// returns, every OTEL_METRIC_EXPORT_INTERVAL (60 s by default).
// [metrics.Setup] calls open only when the environment names it; open
// must not dial, so that a collector that is down does not delay the
// start.
func Push(name string, open func(context.Context, metrics.ExportSettings) (sdkmetric.Exporter, error)) metrics.Exporter {
	return metrics.Exporter{Name: name, Open: func(ctx context.Context, s metrics.ExportSettings) (metrics.Pipeline, error) {
		exp, err := open(ctx, s)
		if err != nil {
			return nil, err
		}
		return &pipeline{settings: s, reader: sdkmetric.NewPeriodicReader(exp)}, nil
	}}
}

// Pull returns the exporter called name whose reader is read when its
// handler is scraped ([metrics.Provider.Handler]); it is always in use,
// listed in OTEL_METRICS_EXPORTER or not, since it costs nothing until
// scraped. Under OTEL_SDK_DISABLED=true, open is called with s.Disabled
// for its handler alone, which should then serve no sample, and its
// reader may be nil.
func Pull(name string, open func(context.Context, metrics.ExportSettings) (sdkmetric.Reader, http.Handler, error)) metrics.Exporter {
	return metrics.Exporter{Name: name, Always: true, Open: func(ctx context.Context, s metrics.ExportSettings) (metrics.Pipeline, error) {
		r, h, err := open(ctx, s)
		if err != nil {
			return nil, err
		}
		return &pipeline{settings: s, reader: r, handler: h}, nil
	}}
}

// pipeline is an opened Exporter: its SDK reader, and its handler when it
// is scraped.
type pipeline struct {
	settings metrics.ExportSettings
	reader   sdkmetric.Reader
	handler  http.Handler
}

// Handler serves a pulled pipeline's scrape; nil for a pushed one.
func (p *pipeline) Handler() http.Handler { return p.handler }

// Join builds one SDK meter provider read by every pipeline of all, which
// must all be this package's.
func (p *pipeline) Join(ctx context.Context, all []metrics.Pipeline) (metrics.Joined, error) {
	res, err := otelsdk.Resource(ctx, p.settings.ServiceName, p.settings.Version)
	if err != nil {
		return metrics.Joined{}, err
	}
	opts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	for _, o := range all {
		q, ok := o.(*pipeline)
		if !ok {
			return metrics.Joined{}, fmt.Errorf("export: cannot join a pipeline of type %T: every exporter must be made by package metrics/export", o)
		}
		if q.reader != nil {
			opts = append(opts, sdkmetric.WithReader(q.reader))
		}
	}
	mp := sdkmetric.NewMeterProvider(opts...)
	return metrics.Joined{
		MeterProvider: mp,
		Shutdown: func(ctx context.Context) error {
			if err := mp.Shutdown(ctx); !errors.Is(err, sdkmetric.ErrReaderShutdown) {
				return err
			}
			return nil
		},
		ServerOption: func(tp trace.TracerProvider) grpc.ServerOption { return grpccalls.ServerOption(tp, mp) },
	}, nil
}

// Shutdown stops the reader of a pipeline that was not joined.
func (p *pipeline) Shutdown(ctx context.Context) error {
	if p.reader == nil {
		return nil
	}
	return p.reader.Shutdown(ctx)
}
