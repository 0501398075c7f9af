package server

import (
	"context"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/telemetry"
)

// Tracing (issue 16; docs/operations.md#tracing).
//
// The envelope and outbox POST routes make one server span per request,
// named after the route, with a child span per phase: authenticate (the
// credential), verify (contract steps 2–4: parse, key, signature, metadata,
// issued_at) and commit (steps 5–6). A single envelope's commit goes
// through the group committer, so its commit span covers the wait for, and
// the commit of, a transaction shared with concurrent requests (attribute
// envelopeworker.commit.grouped); a batch's commit span is its own
// transaction, and the request span carries the item count.
//
// Parent. A single envelope's request span is a child of the envelope's own
// metadata.traceparent when the envelope passed steps 2–4 (its signature
// covers that value, so a forged or refused envelope cannot attach itself
// to someone's trace); otherwise, and for the other routes, of the request's
// traceparent header; otherwise a new trace. A batch cannot have one parent
// per envelope: its request span follows the header, and every accepted
// item with a metadata.traceparent gets a span of its own (ingest.envelope)
// whose parent is that traceparent, linked to the request span.
//
// The parent of a single envelope is only known once the envelope is
// verified, after authentication ran; so phases are recorded as times while
// the request runs, and the spans are made when the parent is known, with
// those times (the OpenTelemetry API takes explicit start and end times).
// The outbox routes need their span while running (its traceparent goes
// into the outbound envelope), so they start it as soon as the request is
// read.
//
// Attributes are the route, the status, the outcome and reason codes, the
// correlation id and, per batch item, the index, outcome, reason and event
// identity: never a credential, signature, payload, idempotency key, or any
// tenant, project or device id.
//
// With tracing off no route is wrapped and phases record nothing: the only
// cost is a nil check per phase (see BenchmarkSingleEnvelope).

// TracerName is the instrumentation scope of ingest-api's spans.
const TracerName = "github.com/envelopeworker/envelopeworker/services/ingest-api"

// Span names besides the routes'.
const (
	spanAuthenticate = "authenticate"
	spanVerify       = "verify"
	spanCommit       = "commit"
	spanEnvelope     = "ingest.envelope"
)

// phase is one timed step of a request.
type phase struct {
	name       string
	start, end time.Time
	grouped    bool // a group commit's shared transaction
}

// itemTrace is a batch item that gets its own span.
type itemTrace struct {
	traceparent string
	attrs       []attribute.KeyValue
}

// reqTrace is a traced request's spans in the making.
type reqTrace struct {
	tracer trace.Tracer
	method string
	name   string
	// parent is the verified envelope's metadata.traceparent (single
	// route), which wins over the header.
	parent string
	ctx    context.Context
	span   trace.Span // nil until begun
	phases []phase
	items  []itemTrace
}

func noop() {}

// phase starts timing a step; the returned func ends it. Without tracing
// it records nothing and allocates nothing.
func (st *reqState) phase(name string) func() { return st.timed(name, false) }

// groupedPhase is phase for a commit through a group committer.
func (st *reqState) groupedPhase(name string) func() { return st.timed(name, true) }

func (st *reqState) timed(name string, grouped bool) func() {
	rt := st.trace
	if rt == nil {
		return noop
	}
	start := time.Now()
	return func() {
		rt.phases = append(rt.phases, phase{name: name, start: start, end: time.Now(), grouped: grouped})
	}
}

// traced wraps a route that makes spans; with tracing off it is the route
// itself.
func (s *Server) traced(next echo.HandlerFunc) echo.HandlerFunc {
	if !s.cfg.Tracing.Enabled() {
		return next
	}
	return func(c echo.Context) (err error) {
		st := state(c)
		method := c.Request().Method
		rt := &reqTrace{tracer: s.tracer, method: method, name: method + " " + st.route}
		st.trace = rt
		defer func() {
			if r := recover(); r != nil {
				// recoverPanic (outside) answers it; the span only says so.
				rt.finish(c, st, errPanic)
				panic(r)
			}
			rt.finish(c, st, err)
		}()
		return next(c)
	}
}

// begin starts the request span, once: with the envelope's traceparent, the
// header's, or none as its parent, and the request's arrival as its start.
func (rt *reqTrace) begin(st *reqState) {
	if rt.span != nil {
		return
	}
	parent := rt.parent
	var links []trace.Link
	if parent == "" {
		parent = st.traceparent
	} else if st.traceparent != "" && st.traceparent != parent {
		// The caller's own trace, which the envelope's replaced as parent.
		links = append(links, trace.LinkFromContext(telemetry.WithParent(context.Background(), st.traceparent)))
	}
	rt.ctx, rt.span = rt.tracer.Start(telemetry.WithParent(context.Background(), parent), rt.name,
		trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(st.start), trace.WithLinks(links...),
		trace.WithAttributes(
			attribute.String("http.request.method", rt.method),
			attribute.String("http.route", st.route),
			telemetry.AttrCorrelationID.String(st.correlationID),
		))
}

// finish makes the spans of a request that has been answered.
func (rt *reqTrace) finish(c echo.Context, st *reqState, err error) {
	rt.begin(st)
	for _, p := range rt.phases {
		_, sp := rt.tracer.Start(rt.ctx, p.name, trace.WithTimestamp(p.start))
		if p.grouped {
			sp.SetAttributes(telemetry.AttrGroupCommit.Bool(true))
		}
		sp.End(trace.WithTimestamp(p.end))
	}
	now := time.Now()
	link := trace.LinkFromContext(rt.ctx)
	for _, it := range rt.items {
		_, sp := rt.tracer.Start(telemetry.WithParent(context.Background(), it.traceparent), spanEnvelope,
			trace.WithTimestamp(st.start), trace.WithLinks(link), trace.WithAttributes(it.attrs...))
		sp.End(trace.WithTimestamp(now))
	}
	status := c.Response().Status
	if err == errPanic {
		status = http.StatusInternalServerError // what recoverPanic will answer
	}
	rt.span.SetAttributes(attribute.Int("http.response.status_code", status))
	if st.outcome != "" {
		rt.span.SetAttributes(telemetry.AttrOutcome.String(st.outcome))
	}
	if st.reason != "" {
		rt.span.SetAttributes(telemetry.AttrReason.String(st.reason))
	}
	if st.items > 0 {
		rt.span.SetAttributes(telemetry.AttrItems.Int(st.items))
	}
	if err != nil || status >= http.StatusInternalServerError {
		// Only the status: an error's text is for the log line.
		rt.span.SetStatus(codes.Error, http.StatusText(status))
	}
	rt.span.End(trace.WithTimestamp(now))
}

// envelopeParent makes the envelope of a single post, once it passed steps
// 2–4, the parent of the request's span.
func (st *reqState) envelopeParent(d decision) {
	if st.trace == nil || d.item.Ingest == nil {
		return
	}
	st.trace.parent = envelope.TraceparentOf(d.item.Ingest.Canonical)
}

// traceItems gives every processed batch item that passed steps 2–4 and
// carries a metadata.traceparent a span of its own.
func (st *reqState) traceItems(decisions []decision, results []batchResult) {
	if st.trace == nil {
		return
	}
	for i, d := range decisions {
		if d.item.Ingest == nil || i >= len(results) {
			continue
		}
		tp := envelope.TraceparentOf(d.item.Ingest.Canonical)
		if tp == "" {
			continue
		}
		a := results[i].Answer
		attrs := []attribute.KeyValue{
			telemetry.AttrItemIndex.Int(i),
			telemetry.AttrOutcome.String(string(a.Outcome)),
			telemetry.AttrEventIdentity.String(a.EventIdentity),
		}
		if a.Reason != "" {
			attrs = append(attrs, telemetry.AttrReason.String(string(a.Reason)))
		}
		st.trace.items = append(st.trace.items, itemTrace{traceparent: tp, attrs: attrs})
	}
}

// outboundTraceparent is the metadata.traceparent of the outbound envelopes
// an outbox request enqueues, so that their delivery attempts join its
// trace: the request span's when tracing is on, else the request's own
// traceparent header (carried through unchanged), else none.
func (s *Server) outboundTraceparent(c echo.Context) string {
	st := state(c)
	if st.trace == nil {
		return st.traceparent
	}
	st.trace.begin(st)
	return telemetry.Traceparent(st.trace.ctx)
}
