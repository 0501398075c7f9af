package server

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/envelopeworker/envelopeworker/modules/telemetry"
)

// BenchmarkIngestSingleTracing is BenchmarkIngestSingle/grouped with
// tracing off (the default: no-op tracer) and on (the SDK with its batch
// processor, as OTEL_EXPORTER_OTLP_ENDPOINT sets it up, exporting to a
// no-op exporter so that the collector's cost is not measured). The cost
// of off against a build without tracing is measured across revisions
// (docs/benchmarks.md).
func BenchmarkIngestSingleTracing(b *testing.B) {
	for _, on := range []bool{false, true} {
		name := "off"
		if on {
			name = "on"
		}
		b.Run(name, func(b *testing.B) {
			tracing := telemetry.Disabled()
			if on {
				tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
				b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
				tracing = telemetry.FromSDK(tp)
			}
			e := newBenchEnv(b, func(c *Config) {
				c.CredentialCacheTTL = time.Second
				c.Tracing = tracing
			})
			per := (b.N + benchProducers - 1) / benchProducers
			reqs := make([][][]byte, benchProducers)
			for p := range reqs {
				for seq := 1; seq <= per; seq++ {
					d := e.signFor(b, p, int64(seq))
					reqs[p] = append(reqs[p], d)
				}
			}
			elapsed := e.run(b, "/v1/envelopes", reqs)
			b.ReportMetric(float64(per*benchProducers)/elapsed.Seconds(), "envelopes/s")
		})
	}
}
