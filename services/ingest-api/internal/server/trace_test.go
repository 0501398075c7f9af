package server

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/telemetry"
	"github.com/envelopeworker/envelopeworker/modules/telemetry/telemetrytest"
)

const (
	deviceTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" // an envelope's metadata.traceparent
	headerTP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" // a request's traceparent header
)

// tracedFixture is newFixture with tracing on, recorded in memory.
func tracedFixture(t *testing.T, outbox bool) (*fixture, *outboxFixture, *tracetest.SpanRecorder) {
	t.Helper()
	rec, tp := telemetrytest.Recorder(t)
	on := func(c *Config) { c.Tracing = tp }
	if outbox {
		o := newOutboxFixture(t, on)
		return o.fixture, o, rec
	}
	return newFixture(t, on), nil, rec
}

var (
	spanAttrs = telemetrytest.Attrs
	tpOf      = telemetrytest.Traceparent
)

// byName splits spans by name; the test fails if a name is not in want.
func byName(t *testing.T, spans []sdktrace.ReadOnlySpan, want ...string) map[string][]sdktrace.ReadOnlySpan {
	t.Helper()
	m := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		m[s.Name()] = append(m[s.Name()], s)
	}
	for name := range m {
		found := false
		for _, w := range want {
			found = found || w == name
		}
		if !found {
			t.Errorf("unexpected span %q", name)
		}
	}
	return m
}

// wantChildren checks that root has exactly the phase spans names, in that
// order, each its child and inside its time.
func wantChildren(t *testing.T, m map[string][]sdktrace.ReadOnlySpan, root sdktrace.ReadOnlySpan, names ...string) {
	t.Helper()
	prev := root.StartTime()
	for _, name := range names {
		if len(m[name]) != 1 {
			t.Fatalf("%d %q spans, want 1", len(m[name]), name)
		}
		s := m[name][0]
		if s.Parent().SpanID() != root.SpanContext().SpanID() || s.SpanContext().TraceID() != root.SpanContext().TraceID() {
			t.Errorf("%q is not a child of %q", name, root.Name())
		}
		if s.StartTime().Before(prev) || s.EndTime().Before(s.StartTime()) || s.EndTime().After(root.EndTime()) {
			t.Errorf("%q [%v, %v] out of order or outside %q [%v, %v]", name, s.StartTime(), s.EndTime(), root.Name(), root.StartTime(), root.EndTime())
		}
		prev = s.EndTime()
	}
}

func signatureOf(t *testing.T, env []byte) string {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(env, &m); err != nil {
		t.Fatal(err)
	}
	return m["signature"].(string)
}

// A verified envelope's metadata.traceparent is the parent of its request
// span (the caller's header becomes a link), with authenticate, verify and
// commit as children.
func TestTraceSingleEnvelope(t *testing.T) {
	f, _, rec := tracedFixture(t, false)
	d := draft(1)
	d.Metadata.Traceparent = deviceTP
	body := f.sign(d)
	r := f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: body,
		header: map[string]string{"Traceparent": headerTP, "Idempotency-Key": d.IdempotencyKey}})
	wantAnswer(t, r, http.StatusOK, "accepted", "", 1)

	spans := rec.Ended()
	m := byName(t, spans, "POST /v1/envelopes", spanAuthenticate, spanVerify, spanCommit)
	if len(m["POST /v1/envelopes"]) != 1 {
		t.Fatalf("%d request spans", len(m["POST /v1/envelopes"]))
	}
	root := m["POST /v1/envelopes"][0]
	if root.SpanKind() != trace.SpanKindServer || !root.Parent().IsRemote() || root.Parent().TraceID().String() != deviceTP[3:35] ||
		root.Parent().SpanID().String() != deviceTP[36:52] {
		t.Fatalf("request span: kind %v parent %v, want a server span under the envelope's traceparent", root.SpanKind(), root.Parent())
	}
	if links := root.Links(); len(links) != 1 || links[0].SpanContext.SpanID().String() != headerTP[36:52] {
		t.Errorf("links %v, want one to the header's traceparent", links)
	}
	a := spanAttrs(root)
	if a[telemetry.AttrOutcome].AsString() != "accepted" || a["http.response.status_code"].AsInt64() != 200 ||
		a["http.route"].AsString() != "/v1/envelopes" || a[telemetry.AttrCorrelationID].AsString() != r.header.Get("X-Correlation-Id") {
		t.Errorf("request span attributes %v", root.Attributes())
	}
	if _, ok := a[telemetry.AttrReason]; ok {
		t.Error("an accepted envelope's span has a reason")
	}
	wantChildren(t, m, root, spanAuthenticate, spanVerify, spanCommit)
	if !spanAttrs(m[spanCommit][0])[telemetry.AttrGroupCommit].AsBool() {
		t.Error("the single route's commit span does not say it is shared")
	}
	assertNoSpanLeak(t, spans, f.device, signatureOf(t, body), d.IdempotencyKey, `{"n":1}`, tenantA, deviceA, projectA)
}

// A refused envelope's traceparent is not trusted: its request span follows
// the header, or starts a trace when there is none, and says why it was
// refused.
func TestTraceRefusedEnvelopeIgnoresItsTraceparent(t *testing.T) {
	f, _, rec := tracedFixture(t, false)
	d := draft(1)
	d.Metadata.Traceparent = deviceTP
	forged := []byte(strings.Replace(string(f.sign(d)), `"n":1`, `"n":2`, 1))
	wantAnswer(t, f.do(req{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: forged,
		header: map[string]string{"Traceparent": headerTP}}), http.StatusForbidden, "refused", "bad_signature", 0)
	wantAnswer(t, f.post(f.device, forged), http.StatusForbidden, "refused", "bad_signature", 0)
	wantAnswer(t, f.post("not-a-token", forged), http.StatusUnauthorized, "refused", "unauthenticated", 0)

	var roots []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "POST /v1/envelopes" {
			roots = append(roots, s)
		}
	}
	if len(roots) != 3 {
		t.Fatalf("%d request spans, want 3", len(roots))
	}
	if p := roots[0].Parent(); p.TraceID().String() != headerTP[3:35] || len(roots[0].Links()) != 0 {
		t.Errorf("refused envelope with header: parent %v links %v, want the header's", p, roots[0].Links())
	}
	for _, s := range roots[1:] {
		if s.Parent().IsValid() {
			t.Errorf("refused envelope without header: parent %v, want a new trace", s.Parent())
		}
	}
	for i, want := range []string{"bad_signature", "bad_signature", "unauthenticated"} {
		a := spanAttrs(roots[i])
		if a[telemetry.AttrOutcome].AsString() != "refused" || a[telemetry.AttrReason].AsString() != want {
			t.Errorf("span %d: %v, want refused/%s", i, roots[i].Attributes(), want)
		}
	}
}

// A batch is one request span (under the header) with the item count; each
// accepted item that carries a traceparent gets an ingest.envelope span
// under it, linked to the request span.
func TestTraceBatch(t *testing.T) {
	f, _, rec := tracedFixture(t, false)
	d1, d2, d3 := draft(1), draft(2), draft(3)
	d1.Metadata.Traceparent = deviceTP
	d3.Metadata.Traceparent = "00-11111111111111111111111111111111-2222222222222222-01"
	bad := []byte(strings.Replace(string(f.sign(d3)), `"n":3`, `"n":4`, 1))
	r := f.do(req{method: http.MethodPost, path: "/v1/envelopes/batch", token: f.device,
		body: batchBody(f.sign(d1), f.sign(d2), bad), header: map[string]string{"Traceparent": headerTP}})
	if r.status != http.StatusOK {
		t.Fatalf("batch: %d %s", r.status, r.body)
	}

	spans := rec.Ended()
	m := byName(t, spans, "POST /v1/envelopes/batch", spanAuthenticate, spanVerify, spanCommit, spanEnvelope)
	root := m["POST /v1/envelopes/batch"][0]
	if root.Parent().SpanID().String() != headerTP[36:52] || spanAttrs(root)[telemetry.AttrItems].AsInt64() != 3 ||
		spanAttrs(root)[telemetry.AttrOutcome].AsString() != "batch" {
		t.Fatalf("batch span: parent %v attributes %v", root.Parent(), root.Attributes())
	}
	wantChildren(t, m, root, spanAuthenticate, spanVerify, spanCommit)
	if _, grouped := spanAttrs(m[spanCommit][0])[telemetry.AttrGroupCommit]; grouped {
		t.Error("a batch's own transaction is marked shared")
	}
	items := m[spanEnvelope]
	if len(items) != 1 {
		t.Fatalf("%d item spans, want 1 (the only verified item with a traceparent)", len(items))
	}
	it := items[0]
	a := spanAttrs(it)
	env, err := envelope.Parse(f.sign(d1))
	if err != nil {
		t.Fatal(err)
	}
	if it.Parent().SpanID().String() != deviceTP[36:52] || it.SpanContext().TraceID().String() != deviceTP[3:35] ||
		a[telemetry.AttrItemIndex].AsInt64() != 0 || a[telemetry.AttrOutcome].AsString() != "accepted" ||
		a[telemetry.AttrEventIdentity].AsString() != env.EventIdentity() {
		t.Errorf("item span: parent %v attributes %v", it.Parent(), it.Attributes())
	}
	if l := it.Links(); len(l) != 1 || l[0].SpanContext.SpanID() != root.SpanContext().SpanID() {
		t.Errorf("item span links %v, want the batch span", l)
	}
	assertNoSpanLeak(t, spans, f.device, signatureOf(t, f.sign(d1)), d1.IdempotencyKey, d2.IdempotencyKey, tenantA, deviceA)
}

// The outbound envelope of an enqueue carries the enqueue's trace in
// metadata.traceparent: the request span's with tracing on, the request's
// own header with tracing off, nothing without either; an invalid header is
// ignored.
func TestTraceOutboxStampsTheEnvelope(t *testing.T) {
	t.Run("on", func(t *testing.T) {
		f, o, rec := tracedFixture(t, true)
		r := f.do(req{method: http.MethodPost, path: "/v1/outbox", token: f.service, body: outboxBody("k-1", "n"),
			header: map[string]string{"Traceparent": headerTP}})
		_, env := o.enqueued(r, http.StatusCreated, o.pub)
		spans := rec.Ended()
		m := byName(t, spans, "POST /v1/outbox", spanAuthenticate, spanCommit)
		root := m["POST /v1/outbox"][0]
		if root.Parent().SpanID().String() != headerTP[36:52] || spanAttrs(root)[telemetry.AttrOutcome].AsString() != "created" {
			t.Fatalf("outbox span: parent %v attributes %v", root.Parent(), root.Attributes())
		}
		if env.Metadata.Traceparent != tpOf(root.SpanContext()) {
			t.Fatalf("envelope traceparent %q, want the enqueue span's %q", env.Metadata.Traceparent, tpOf(root.SpanContext()))
		}
		wantChildren(t, m, root, spanAuthenticate, spanCommit)

		// A batch stamps every item with its one span.
		r = f.do(req{method: http.MethodPost, path: "/v1/outbox/batch", token: f.service,
			body: []byte(`{"messages":[` + string(outboxBody("k-2", "a")) + `,` + string(outboxBody("k-3", "b")) + `]}`)})
		if r.status != http.StatusOK {
			t.Fatalf("batch: %d %s", r.status, r.body)
		}
		var batch struct {
			Results []struct {
				Envelope json.RawMessage `json:"envelope"`
			} `json:"results"`
		}
		if err := json.Unmarshal(r.body, &batch); err != nil || len(batch.Results) != 2 {
			t.Fatalf("batch answer %s: %v", r.body, err)
		}
		var broot sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			if s.Name() == "POST /v1/outbox/batch" {
				broot = s
			}
		}
		if broot == nil || broot.Parent().IsValid() || spanAttrs(broot)[telemetry.AttrItems].AsInt64() != 2 {
			t.Fatalf("outbox batch span %v", broot)
		}
		for i, res := range batch.Results {
			if got := envelope.TraceparentOf(res.Envelope); got != tpOf(broot.SpanContext()) {
				t.Errorf("item %d traceparent %q, want the batch span's", i, got)
			}
		}
		assertNoSpanLeak(t, rec.Ended(), f.service, payloadTag, "k-1", "k-2", signatureOf(t, env.Canonical()), tenantA, projectA)
	})
	t.Run("off", func(t *testing.T) {
		o := newOutboxFixture(t)
		for _, tc := range []struct{ key, header, want string }{
			{"k-1", headerTP, headerTP},
			{"k-2", "", ""},
			{"k-3", strings.ToUpper(headerTP), ""},
			{"k-4", headerTP + "-00", ""},
		} {
			r := o.do(req{method: http.MethodPost, path: "/v1/outbox", token: o.service, body: outboxBody(tc.key, "n"),
				header: map[string]string{"Traceparent": tc.header}})
			_, env := o.enqueued(r, http.StatusCreated, o.pub)
			if env.Metadata.Traceparent != tc.want {
				t.Errorf("header %q: envelope traceparent %q, want %q", tc.header, env.Metadata.Traceparent, tc.want)
			}
		}
		// A repeat answers the stored envelope, whatever trace it comes with.
		r := o.do(req{method: http.MethodPost, path: "/v1/outbox", token: o.service, body: outboxBody("k-2", "n"),
			header: map[string]string{"Traceparent": headerTP}})
		if _, env := o.enqueued(r, http.StatusOK, o.pub); env.Metadata.Traceparent != "" {
			t.Errorf("a repeat took the new request's traceparent %q", env.Metadata.Traceparent)
		}
	})
}

// assertNoSpanLeak fails when a span's name, attribute, event, link or
// status holds one of secrets.
func assertNoSpanLeak(t *testing.T, spans []sdktrace.ReadOnlySpan, secrets ...string) {
	t.Helper()
	if len(spans) == 0 {
		t.Fatal("no spans to check")
	}
	for _, s := range spans {
		texts := []string{s.Name(), s.Status().Description}
		for _, kv := range s.Attributes() {
			texts = append(texts, string(kv.Key), kv.Value.Emit())
		}
		for _, ev := range s.Events() {
			texts = append(texts, ev.Name)
			for _, kv := range ev.Attributes {
				texts = append(texts, kv.Value.Emit())
			}
		}
		for _, l := range s.Links() {
			for _, kv := range l.Attributes {
				texts = append(texts, kv.Value.Emit())
			}
		}
		for _, text := range texts {
			for _, secret := range secrets {
				if secret != "" && strings.Contains(text, secret) {
					t.Errorf("span %q holds %q in %q", s.Name(), secret, text)
				}
			}
		}
	}
}
