package producer

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// recorder collects what WithObserver reports.
type recorder struct {
	mu       sync.Mutex
	attempts []Attempt
}

func (r *recorder) observe(a Attempt) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts = append(r.attempts, a)
}

func (r *recorder) take() []Attempt {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.attempts
	r.attempts = nil
	return out
}

// posts drops the stream reads Resume makes, after checking their shape.
func posts(t *testing.T, as []Attempt) []Attempt {
	t.Helper()
	var out []Attempt
	for _, a := range as {
		if a.Method == http.MethodGet {
			if a.Route != wire.StreamPath("proj-1", "device-7") || a.Sequences != nil || a.Status != http.StatusOK || a.Retry {
				t.Fatalf("stream read reported as %+v", a)
			}
			continue
		}
		out = append(out, a)
	}
	return out
}

func TestObserverSeesAcceptedDuplicateAndRefusal(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	svc.refuse["evt-0002"] = wire.ReasonUnknownKey
	rec := &recorder{}
	p := newTestProducer(t, srv.URL, &MemoryStore{}, WithObserver(rec.observe))
	ctx := context.Background()

	if _, err := p.Send(ctx, event(1)); err != nil {
		t.Fatal(err)
	}
	as := rec.take()
	if len(as) != 2 || as[0].Method != http.MethodGet {
		t.Fatalf("want the stream read then one POST, got %+v", as)
	}
	a := posts(t, as)[0]
	if a.Method != http.MethodPost || a.Route != wire.RouteEnvelopes || !slices.Equal(a.Sequences, []int64{1}) ||
		a.Status != http.StatusOK || a.Err != nil || a.Retry || a.Answer.Outcome != wire.OutcomeAccepted ||
		a.Answer.Cursor == nil || *a.Answer.Cursor != 1 || a.Answer.CorrelationID != "c1" || a.Results != nil {
		t.Fatalf("accepted reported as %+v", a)
	}

	r, err := p.Send(ctx, event(2))
	if err != nil || r.Outcome != wire.OutcomeRefused {
		t.Fatalf("%+v %v", r, err)
	}
	as = posts(t, rec.take())
	if len(as) != 1 || as[0].Status != http.StatusForbidden || as[0].Retry || as[0].Err != nil ||
		as[0].Answer.Outcome != wire.OutcomeRefused || as[0].Answer.Reason != wire.ReasonUnknownKey {
		t.Fatalf("refusal reported as %+v", as)
	}
}

func TestObserverSeesEveryRetryAndItsAnswer(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	svc.faults = append(svc.faults, status(503, ""), status(429, "0"))
	rec := &recorder{}
	p := newTestProducer(t, srv.URL, &MemoryStore{}, WithObserver(rec.observe))
	if r, err := p.Send(context.Background(), event(1)); err != nil || r.Outcome != wire.OutcomeAccepted {
		t.Fatalf("%+v %v", r, err)
	}
	as := posts(t, rec.take())
	want := []struct {
		status int
		reason wire.Reason
		retry  bool
	}{
		{http.StatusServiceUnavailable, wire.ReasonUnavailable, true},
		{http.StatusTooManyRequests, wire.ReasonRateLimited, true},
		{http.StatusOK, "", false},
	}
	if len(as) != len(want) {
		t.Fatalf("%d attempts reported, want %d: %+v", len(as), len(want), as)
	}
	for i, w := range want {
		a := as[i]
		if a.Status != w.status || a.Answer.Reason != w.reason || a.Retry != w.retry || a.Err != nil ||
			!slices.Equal(a.Sequences, []int64{1}) || a.Route != wire.RouteEnvelopes {
			t.Fatalf("attempt %d reported as %+v, want %+v", i, a, w)
		}
	}
	if as[2].Answer.Outcome != wire.OutcomeAccepted {
		t.Fatalf("last attempt %+v", as[2])
	}
}

func TestObserverSeesConnectionErrorThenDuplicate(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	svc.hangUps = 1 // the service commits, then the connection drops
	rec := &recorder{}
	p := newTestProducer(t, srv.URL, &MemoryStore{}, WithObserver(rec.observe))
	r, err := p.Send(context.Background(), event(1))
	if err != nil || r.Outcome != wire.OutcomeDuplicate {
		t.Fatalf("%+v %v", r, err)
	}
	as := posts(t, rec.take())
	if len(as) != 2 {
		t.Fatalf("%d attempts reported, want 2: %+v", len(as), as)
	}
	if as[0].Err == nil || as[0].Status != 0 || !as[0].Retry || as[0].Answer != (wire.Answer{}) {
		t.Fatalf("dropped connection reported as %+v", as[0])
	}
	if as[1].Err != nil || as[1].Status != http.StatusOK || as[1].Retry || as[1].Answer.Outcome != wire.OutcomeDuplicate {
		t.Fatalf("re-send reported as %+v", as[1])
	}
}

func TestObserverSeesBatchResultsAndTheItemsSentAgain(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	svc.limitAfter = 2
	rec := &recorder{}
	p := newTestProducer(t, srv.URL, &MemoryStore{}, WithObserver(rec.observe))
	if _, err := p.SendBatch(context.Background(), []Event{event(1), event(2), event(3)}); err != nil {
		t.Fatal(err)
	}
	as := posts(t, rec.take())
	if len(as) != 2 {
		t.Fatalf("%d attempts reported, want 2: %+v", len(as), as)
	}
	first := as[0]
	if first.Route != wire.RouteBatch || !slices.Equal(first.Sequences, []int64{1, 2, 3}) || first.Status != http.StatusOK ||
		first.Retry || len(first.Results) != 3 || first.Results[2].Status != http.StatusTooManyRequests ||
		first.Results[0].Outcome != wire.OutcomeAccepted {
		t.Fatalf("batch answer reported as %+v", first)
	}
	// One envelope left: it goes on the single route.
	if as[1].Route != wire.RouteEnvelopes || !slices.Equal(as[1].Sequences, []int64{3}) || as[1].Answer.Outcome != wire.OutcomeAccepted {
		t.Fatalf("re-sent item reported as %+v", as[1])
	}
}

func TestObserverNeverSeesTheCredential(t *testing.T) {
	_, srv := newFakeService(t, testSigner(t).PublicKey())
	rec := &recorder{}
	p := newTestProducer(t, srv.URL, &MemoryStore{}, WithObserver(rec.observe))
	if _, err := p.Send(context.Background(), event(1)); err != nil {
		t.Fatal(err)
	}
	for _, a := range rec.take() {
		if s := fmt.Sprintf("%+v %#v", a, a); strings.Contains(s, "tok") {
			t.Fatalf("attempt carries the credential: %s", s)
		}
	}
}
