package telemetry

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
)

// HeaderTraceparent is the W3C Trace Context request header.
const HeaderTraceparent = "traceparent"

// w3c is W3C Trace Context and nothing else: no baggage, which could carry
// whatever a client put in it into the binaries' outgoing requests.
var w3c = propagation.TraceContext{}

// WithParent returns ctx with traceparent as its remote parent span
// context, or ctx itself when traceparent is empty or not a valid W3C
// traceparent (it is then ignored, as a malformed header would be).
func WithParent(ctx context.Context, traceparent string) context.Context {
	if traceparent == "" {
		return ctx
	}
	return w3c.Extract(ctx, propagation.MapCarrier{HeaderTraceparent: traceparent})
}

// Traceparent is the W3C traceparent of ctx's span context ("" when it has
// none): with tracing on, the current span's; with it off, the parent
// carried forward.
func Traceparent(ctx context.Context) string {
	c := propagation.MapCarrier{}
	w3c.Inject(ctx, c)
	return c[HeaderTraceparent]
}

// Inject sets the traceparent header of ctx's span context on h (and
// nothing when there is none).
func Inject(ctx context.Context, h http.Header) {
	if tp := Traceparent(ctx); tp != "" {
		h.Set(HeaderTraceparent, tp)
	}
}

// Span attribute keys: the only attributes the binaries set besides the
// HTTP semantic conventions'. None ever holds a payload, credential,
// signature, idempotency key, secret, URL or response body: ids that name
// a row are what an operator needs to go from a span to the database.
const (
	AttrOutcome       = attribute.Key("envelopeworker.outcome")
	AttrReason        = attribute.Key("envelopeworker.reason")
	AttrItems         = attribute.Key("envelopeworker.batch.items")
	AttrItemIndex     = attribute.Key("envelopeworker.batch.index")
	AttrCorrelationID = attribute.Key("envelopeworker.correlation_id")
	AttrEventIdentity = attribute.Key("envelopeworker.event_identity")
	AttrGroupCommit   = attribute.Key("envelopeworker.commit.grouped")
	AttrMessageID     = attribute.Key("envelopeworker.message_id")
	AttrEndpointID    = attribute.Key("envelopeworker.endpoint_id")
	AttrAttempt       = attribute.Key("envelopeworker.attempt")
	AttrMaxAttempts   = attribute.Key("envelopeworker.max_attempts")
	AttrVerdict       = attribute.Key("envelopeworker.verdict")
	AttrErrorCode     = attribute.Key("envelopeworker.error_code")
)
