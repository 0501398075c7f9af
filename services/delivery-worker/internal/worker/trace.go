package worker

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/telemetry"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/sender"
)

// TracerName names the worker's spans' instrumentation scope.
const TracerName = "github.com/envelopeworker/envelopeworker/services/delivery-worker"

// SpanAttempt is the client span of one delivery attempt.
const SpanAttempt = "delivery.attempt"

// startAttempt starts the span of one attempt. Its parent is the outbound
// envelope's own metadata.traceparent (set by ingest-api from the enqueue
// request's trace), so an attempt joins the trace of what caused it; the
// sender sends the returned context's traceparent as the webhook's
// traceparent header. With tracing off the tracer is a no-op that carries
// that parent forward, so the receiver still gets the envelope's
// traceparent.
func (w *Worker) startAttempt(ctx context.Context, c store.Claimed) (context.Context, trace.Span) {
	ctx = telemetry.WithParent(ctx, envelope.TraceparentOf(c.Body))
	if !w.tracing {
		return w.tracer.Start(ctx, SpanAttempt)
	}
	// Ids name rows an operator can look up; never the URL (its query may
	// hold a token), the body, a header or a secret ref.
	return w.tracer.Start(ctx, SpanAttempt, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("http.request.method", "POST"),
		telemetry.AttrMessageID.String(c.MessageID),
		telemetry.AttrEndpointID.String(c.EndpointID),
		telemetry.AttrEventIdentity.String(c.EventIdentity),
		telemetry.AttrAttempt.Int(c.Attempt),
		telemetry.AttrMaxAttempts.Int(c.MaxAttempts),
	))
}

// endAttempt ends the span with what the attempt came to: the verdict of
// its answer (a retry verdict on the last allowed attempt makes the message
// dead when settled), the stable error code and the HTTP status; an attempt
// cut short (err) is "aborted".
func (w *Worker) endAttempt(span trace.Span, res sender.Result, err error) {
	if !span.IsRecording() {
		return
	}
	defer span.End()
	if err != nil {
		span.SetAttributes(telemetry.AttrVerdict.String("aborted"))
		span.SetStatus(codes.Error, "aborted")
		return
	}
	span.SetAttributes(telemetry.AttrVerdict.String(res.Verdict.String()))
	if res.Status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", res.Status))
	}
	if res.Code != "" {
		span.SetAttributes(telemetry.AttrErrorCode.String(res.Code))
	}
	if res.Verdict != sender.Delivered {
		span.SetStatus(codes.Error, res.Code)
	}
}
