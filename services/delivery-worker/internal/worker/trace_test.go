package worker

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/telemetry"
	"github.com/envelopeworker/envelopeworker/modules/telemetry/telemetrytest"
)

const (
	deviceTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	payloadMarker     = "payload-marker-7f3a"
	idemKeyMarker     = "idem-key-marker-91c2"
	urlTokenMarker    = "url-token-marker-55d0"
)

// enqueueSigned stores one real signed envelope (as ingest-api builds it)
// for (tenant, p1, topic), with metadata.traceparent tp when not empty.
func (e *env) enqueueSigned(tenant, topic, tp string, maxAttempts int) ([]byte, []string) {
	e.t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		e.t.Fatal(err)
	}
	nonce := make([]byte, 8)
	_, _ = rand.Read(nonce)
	key := idemKeyMarker + "-" + hex.EncodeToString(nonce)
	res, err := e.st.Outbox().Enqueue(context.Background(), store.Actor{TenantID: tenant, DeviceID: "svc1", CorrelationID: "c-1"},
		store.EnqueueRequest{
			ProjectID: "p1", ProducerID: "svc1", Topic: topic,
			IdempotencyDigest: envelope.IdempotencyDigest(tenant, "p1", key), RequestDigest: sha256.Sum256([]byte(key)),
			MaxAttempts: maxAttempts,
			Build: func(seq int64) ([]byte, string, error) {
				env, err := envelope.Sign(envelope.Draft{
					TenantID: tenant, ProjectID: "p1", ProducerID: "svc1", EventID: "ob-" + hex.EncodeToString(nonce),
					IdempotencyKey: key, KeyID: "k1", Sequence: seq, IssuedAt: time.Now(),
					Metadata: envelope.Metadata{Kind: "proposal", Traceparent: tp},
					Payload:  []byte(`{"secret":"` + payloadMarker + `"}`),
				}, priv)
				if err != nil {
					return nil, "", err
				}
				return env.Canonical(), env.EventIdentity(), nil
			},
		})
	if err != nil {
		e.t.Fatalf("Enqueue: %v", err)
	}
	return res.Envelope, res.MessageIDs
}

// headerLog records the traceparent header of every webhook request, in
// order.
type headerLog struct {
	mu  sync.Mutex
	got []string
}

func (h *headerLog) answer(status func(n int) int) func(r *http.Request, n int) int {
	return func(r *http.Request, n int) int {
		h.mu.Lock()
		defer h.mu.Unlock()
		vs := r.Header.Values(telemetry.HeaderTraceparent)
		h.got = append(h.got, strings.Join(vs, "|"))
		return status(n)
	}
}

func (h *headerLog) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.got...)
}

var (
	recorder      = telemetrytest.Recorder
	attrsOf       = telemetrytest.Attrs
	traceparentOf = telemetrytest.Traceparent
)

// Each attempt is one client span whose parent is the envelope's
// metadata.traceparent, and the webhook request carries that span's
// traceparent; the spans say which attempt, what came back and nothing of
// the body, URL, key or secret.
func TestAttemptSpansFollowTheEnvelopeTrace(t *testing.T) {
	e := newEnv(t)
	var hl headerLog
	rc := newReceiver(t, hl.answer(func(n int) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	}))
	ep := e.endpoint("t1", "orders", rc.srv.URL+"/hook?token="+urlTokenMarker, "ep")
	body, ids := e.enqueueSigned("t1", "orders", deviceTraceparent, 5)
	rec, tracing := recorder(t)
	w, _ := newWorker(t, e.dsn, opts{tracing: tracing})
	cycleUntil(t, w, func() bool { return e.status("t1", ids[0]).Status == store.StatusDelivered })

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want one per attempt (2)", len(spans))
	}
	headers := hl.all()
	if len(headers) != 2 || rc.bad.Load() != 0 {
		t.Fatalf("receiver saw %d requests (%d bad)", len(headers), rc.bad.Load())
	}
	parent, err := trace.TraceIDFromHex(deviceTraceparent[3:35])
	if err != nil {
		t.Fatal(err)
	}
	wantVerdict := []string{"retry", "delivered"}
	wantStatus := []int64{503, 204}
	for i, s := range spans {
		a := attrsOf(s)
		if s.Name() != SpanAttempt || s.SpanKind() != trace.SpanKindClient {
			t.Errorf("span %d: %q kind %v", i, s.Name(), s.SpanKind())
		}
		if s.SpanContext().TraceID() != parent || !s.Parent().IsRemote() || s.Parent().SpanID().String() != deviceTraceparent[36:52] {
			t.Errorf("span %d: parent %v, want the envelope's traceparent", i, s.Parent())
		}
		if headers[i] != traceparentOf(s.SpanContext()) {
			t.Errorf("attempt %d: webhook traceparent %q, want the attempt span's %q", i+1, headers[i], traceparentOf(s.SpanContext()))
		}
		if a[telemetry.AttrAttempt].AsInt64() != int64(i+1) || a[telemetry.AttrMaxAttempts].AsInt64() != 5 ||
			a[telemetry.AttrMessageID].AsString() != ids[0] || a[telemetry.AttrEndpointID].AsString() != ep ||
			a[telemetry.AttrVerdict].AsString() != wantVerdict[i] || a["http.response.status_code"].AsInt64() != wantStatus[i] {
			t.Errorf("span %d attributes %v", i, s.Attributes())
		}
		if s.EndTime().Before(s.StartTime()) || s.EndTime().IsZero() {
			t.Errorf("span %d has no duration", i)
		}
	}
	if a := attrsOf(spans[0]); a[telemetry.AttrErrorCode].AsString() != "http_5xx" || spans[0].Status().Code != codes.Error {
		t.Errorf("failed attempt: code %q status %v", a[telemetry.AttrErrorCode].AsString(), spans[0].Status())
	}
	if _, ok := attrsOf(spans[1])[telemetry.AttrErrorCode]; ok || spans[1].Status().Code == codes.Error {
		t.Errorf("delivered attempt carries an error")
	}
	sig := body[strings.Index(string(body), `"signature":"`)+13:]
	sig = sig[:strings.IndexByte(string(sig), '"')]
	assertNoLeak(t, spans, payloadMarker, idemKeyMarker, urlTokenMarker, testSecret, string(sig), rc.srv.URL)
}

// assertNoLeak fails when any attribute, event, link or status of spans
// holds one of secrets.
func assertNoLeak(t *testing.T, spans []sdktrace.ReadOnlySpan, secrets ...string) {
	t.Helper()
	for _, s := range spans {
		texts := []string{s.Name(), s.Status().Description}
		for _, kv := range s.Attributes() {
			texts = append(texts, string(kv.Key), kv.Value.Emit())
		}
		for _, ev := range s.Events() {
			texts = append(texts, ev.Name)
			for _, kv := range ev.Attributes {
				texts = append(texts, string(kv.Key), kv.Value.Emit())
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
					t.Errorf("span %q holds a secret in %q", s.Name(), text)
				}
			}
		}
	}
}

// With tracing off no span is made, but the webhook still carries the
// envelope's traceparent unchanged, so the receiver's own tracing joins the
// device's trace; an envelope without one sends no traceparent header.
func TestTracingOffPassesTheEnvelopeTraceparent(t *testing.T) {
	e := newEnv(t)
	var hl headerLog
	rc := newReceiver(t, hl.answer(func(int) int { return http.StatusNoContent }))
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, with := e.enqueueSigned("t1", "orders", deviceTraceparent, 5)
	w, _ := newWorker(t, e.dsn, opts{concurrency: 1})
	cycleUntil(t, w, func() bool { return e.status("t1", with[0]).Status == store.StatusDelivered })
	_, without := e.enqueueSigned("t1", "orders", "", 5)
	cycleUntil(t, w, func() bool { return e.status("t1", without[0]).Status == store.StatusDelivered })
	if got := hl.all(); len(got) != 2 || got[0] != deviceTraceparent || got[1] != "" || rc.bad.Load() != 0 {
		t.Fatalf("webhook traceparents %q (bad %d), want [%q, \"\"]", got, rc.bad.Load(), deviceTraceparent)
	}
}

// An envelope without a traceparent starts a new trace at its attempt.
func TestAttemptWithoutParentIsARoot(t *testing.T) {
	e := newEnv(t)
	var hl headerLog
	rc := newReceiver(t, hl.answer(func(int) int { return http.StatusNoContent }))
	e.endpoint("t1", "orders", rc.srv.URL+"/hook", "ep")
	_, ids := e.enqueueSigned("t1", "orders", "", 5)
	rec, tracing := recorder(t)
	w, _ := newWorker(t, e.dsn, opts{tracing: tracing})
	cycleUntil(t, w, func() bool { return e.status("t1", ids[0]).Status == store.StatusDelivered })
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Parent().IsValid() {
		t.Fatalf("%d spans; want one root span", len(spans))
	}
	if got := hl.all(); len(got) != 1 || got[0] != traceparentOf(spans[0].SpanContext()) {
		t.Fatalf("webhook traceparent %q, want the root span's", got)
	}
}
