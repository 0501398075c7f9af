// Package telemetrytest owns what the services' tracing tests share: a
// tracer provider recording in memory, a span's attributes as a map, and a
// span context written as the W3C traceparent a test expects to see.
package telemetrytest

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/envelopeworker/envelopeworker/modules/telemetry"
)

// Recorder is tracing on, every ended span kept in the returned recorder;
// the provider shuts down when the test ends.
func Recorder(t testing.TB) (*tracetest.SpanRecorder, *telemetry.Provider) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return rec, telemetry.FromSDK(tp)
}

// Attrs is a span's attributes by key.
func Attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// Traceparent is sc in the W3C form (version 00), written out here rather
// than by the propagator under test.
func Traceparent(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}
