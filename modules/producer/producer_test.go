package producer

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

var testStream = Stream{TenantID: "tenant-a", ProjectID: "proj-1", ProducerID: "device-7"}

func testSigner(t testing.TB) *envelope.Signer {
	t.Helper()
	s, err := envelope.NewSigner("k1", ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32)))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func newTestProducer(t testing.TB, url string, store SequenceStore, opts ...Option) *Producer {
	t.Helper()
	opts = append([]Option{WithStream(testStream), WithStore(store), WithBackoff(time.Millisecond, 5*time.Millisecond), WithDeadline(5 * time.Second)}, opts...)
	p, err := New(url, "tok", testSigner(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func event(i int) Event {
	return Event{
		EventID:  fmt.Sprintf("evt-%04d", i),
		Metadata: envelope.Metadata{Kind: "task.status"},
		Payload:  []byte(fmt.Sprintf(`{"n":%d,"note":"caf\u00e9 <&>"}`, i)),
	}
}

func TestSendAssignsContiguousSequences(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	p := newTestProducer(t, srv.URL, &MemoryStore{})
	for i := 1; i <= 3; i++ {
		r, err := p.Send(context.Background(), event(i))
		if err != nil {
			t.Fatal(err)
		}
		if r.Outcome != wire.OutcomeAccepted || r.Sequence != int64(i) || r.Cursor != int64(i) || !r.Delivered() {
			t.Fatalf("send %d: %+v", i, r)
		}
		if r.EventIdentity != envelope.EventIdentity("tenant-a", "proj-1", event(i).EventID) || r.CorrelationID != "c1" {
			t.Fatalf("send %d: identity or correlation id: %+v", i, r)
		}
	}
	if cursor, held, _ := svc.snapshot(); cursor != 3 || held != 3 {
		t.Fatalf("service cursor %d, held %d", cursor, held)
	}
}

func TestRetriesUnavailableAndRateLimitedThenAnswers(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	svc.faults = append(svc.faults, status(503, ""), status(500, ""), status(429, "0"), status(502, ""))
	p := newTestProducer(t, srv.URL, &MemoryStore{})
	r, err := p.Send(context.Background(), event(1))
	if err != nil || r.Outcome != wire.OutcomeAccepted {
		t.Fatalf("%+v %v", r, err)
	}
	// GET stream, four failed attempts, the answered one.
	if _, _, n := svc.snapshot(); n != 6 {
		t.Fatalf("requests %d, want 6", n)
	}
	if len(svc.bodies) != 1 {
		t.Fatalf("service saw %d envelopes", len(svc.bodies))
	}
}

func TestRefusalIsReturnedAtOnceAndFreesItsSequence(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	svc.refuse["evt-0001"] = wire.ReasonUnknownKey
	p := newTestProducer(t, srv.URL, &MemoryStore{})
	r, err := p.Send(context.Background(), event(1))
	if err != nil {
		t.Fatal(err)
	}
	if r.Outcome != wire.OutcomeRefused || r.Reason != wire.ReasonUnknownKey || r.Status != http.StatusForbidden || r.Delivered() {
		t.Fatalf("%+v", r)
	}
	if _, _, n := svc.snapshot(); n != 2 { // the stream read and one POST: never retried
		t.Fatalf("requests %d, want 2", n)
	}
	// The refused envelope was not retained, so its sequence is used again
	// and the stream has no gap.
	r, err = p.Send(context.Background(), event(2))
	if err != nil || r.Sequence != 1 || r.Cursor != 1 {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestLocalRuleBreachUsesNoSequenceAndSendsNothing(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	p := newTestProducer(t, srv.URL, &MemoryStore{})
	bad := event(1)
	bad.Metadata.Kind = "Not A Kind"
	_, err := p.Send(context.Background(), bad)
	if r, ok := envelope.ReasonOf(err); !ok || r != envelope.ReasonInvalidMetadata {
		t.Fatalf("err %v", err)
	}
	future := event(1)
	future.IssuedAt = time.Now().Add(time.Hour)
	if _, err := p.Send(context.Background(), future); err == nil {
		t.Fatal("an issued_at an hour ahead was sent")
	}
	if _, err := p.SendBatch(context.Background(), []Event{event(1), {EventID: "x"}}); err == nil {
		t.Fatal("a batch with an event without payload was sent")
	}
	if len(svc.bodies) != 0 {
		t.Fatalf("service saw %d envelopes", len(svc.bodies))
	}
	r, err := p.Send(context.Background(), event(1))
	if err != nil || r.Sequence != 1 {
		t.Fatalf("%+v %v", r, err)
	}
}

func TestUndeliveredStaysPendingAndIsResentByteForByte(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	store := &MemoryStore{}
	p := newTestProducer(t, srv.URL, store)
	if _, err := p.Send(context.Background(), event(1)); err != nil {
		t.Fatal(err)
	}
	for range 1000 {
		svc.faults = append(svc.faults, status(503, ""))
	}
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := p.Send(short, event(2))
	if !errors.Is(err, ErrUndelivered) {
		t.Fatalf("err %v, want ErrUndelivered", err)
	}
	st, _ := store.Load(context.Background())
	if len(st.Pending) != 1 || st.Pending[0].Sequence != 2 {
		t.Fatalf("pending %+v", st.Pending)
	}
	svc.mu.Lock()
	svc.faults = nil
	svc.mu.Unlock()
	r, err := p.Send(context.Background(), event(3))
	if err != nil || r.Sequence != 3 || r.Cursor != 3 {
		t.Fatalf("%+v %v", r, err)
	}
	// An attempt cut off by the deadline may still reach the service after
	// it recovers; every copy of envelope 2 must be the saved bytes.
	copies := 0
	for _, b := range svc.bodies {
		if bytes.Contains(b, []byte(`"sequence":2,`)) {
			copies++
			if !bytes.Equal(b, st.Pending[0].Envelope) {
				t.Fatalf("envelope 2 was re-sent as\n%s\nnot as saved\n%s", b, st.Pending[0].Envelope)
			}
		}
	}
	if copies == 0 {
		t.Fatal("the pending envelope was never re-sent")
	}
	if st, _ := store.Load(context.Background()); len(st.Pending) != 0 || st.Last != 3 {
		t.Fatalf("state after resume %+v", st)
	}
}

func TestCrashBetweenSendAndAnswerResumesWithoutLossOrDoubling(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	path := filepath.Join(t.TempDir(), "stream.json")
	p := newTestProducer(t, srv.URL, NewFileStore(path))
	for i := 1; i <= 2; i++ {
		if _, err := p.Send(context.Background(), event(i)); err != nil {
			t.Fatal(err)
		}
	}
	// The service commits the third envelope and every attempt loses its
	// answer until the deadline: the process ends knowing nothing.
	svc.mu.Lock()
	svc.hangUps = 1 << 20
	svc.mu.Unlock()
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if _, err := p.Send(short, event(3)); !errors.Is(err, ErrUndelivered) {
		t.Fatalf("err %v, want ErrUndelivered", err)
	}
	svc.mu.Lock()
	svc.hangUps = 0
	svc.mu.Unlock()
	saved, _ := NewFileStore(path).Load(context.Background())
	// A new process with the same file.
	q := newTestProducer(t, srv.URL, NewFileStore(path))
	resent, err := q.Resume(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(saved.Pending) != 1 || saved.Pending[0].Sequence != 3 {
		t.Fatalf("saved pending %+v", saved.Pending)
	}
	if len(resent) != 1 || resent[0].Outcome != wire.OutcomeDuplicate || resent[0].Sequence != 3 || resent[0].EventID != "evt-0003" {
		t.Fatalf("resent %+v", resent)
	}
	r, err := q.Send(context.Background(), event(4))
	if err != nil || r.Sequence != 4 || r.Cursor != 4 {
		t.Fatalf("%+v %v", r, err)
	}
	if cursor, held, _ := svc.snapshot(); cursor != 4 || held != 4 {
		t.Fatalf("service cursor %d, held %d: lost or doubled", cursor, held)
	}
}

func TestResumeContinuesAboveTheServersCursor(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	p := newTestProducer(t, srv.URL, &MemoryStore{})
	for i := 1; i <= 5; i++ {
		if _, err := p.Send(context.Background(), event(i)); err != nil {
			t.Fatal(err)
		}
	}
	// The state is lost (a new device image): the cursor is the truth.
	q := newTestProducer(t, srv.URL, &MemoryStore{})
	r, err := q.Send(context.Background(), event(6))
	if err != nil || r.Sequence != 6 {
		t.Fatalf("%+v %v", r, err)
	}
	if cursor, _, _ := svc.snapshot(); cursor != 6 {
		t.Fatalf("cursor %d", cursor)
	}
}

func TestSendBatchResendsItemsTheLimiterDidNotProcess(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	svc.limitAfter = 2
	p := newTestProducer(t, srv.URL, &MemoryStore{})
	evs := []Event{event(1), event(2), event(3), event(4)}
	rs, err := p.SendBatch(context.Background(), evs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if r.Outcome != wire.OutcomeAccepted || r.Sequence != int64(i+1) || r.Status != 200 {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	if cursor, held, _ := svc.snapshot(); cursor != 4 || held != 4 {
		t.Fatalf("cursor %d held %d", cursor, held)
	}
	if _, err := p.SendBatch(context.Background(), nil); err == nil {
		t.Fatal("an empty batch was accepted")
	}
	if _, err := p.SendBatch(context.Background(), make([]Event, 101)); err == nil {
		t.Fatal("a batch of 101 was accepted")
	}
}

func TestWholeBatchRefusalAppliesToEveryItem(t *testing.T) {
	_, srv := newFakeService(t, testSigner(t).PublicKey())
	p, err := New(srv.URL, "wrong", testSigner(t), WithStream(testStream), WithStore(&MemoryStore{}))
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.SendBatch(context.Background(), []Event{event(1), event(2)})
	var re *RefusalError
	if !errors.As(err, &re) || re.Reason != wire.ReasonUnauthenticated || re.Status != 401 {
		t.Fatalf("err %v", err)
	}
}

func TestWholeBatchRefusalWhenSyncedIsEveryItemsResult(t *testing.T) {
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	p := newTestProducer(t, srv.URL, &MemoryStore{})
	if _, err := p.Resume(context.Background()); err != nil {
		t.Fatal(err)
	}
	svc.faults = append(svc.faults, status(http.StatusRequestEntityTooLarge, ""))
	rs, err := p.SendBatch(context.Background(), []Event{event(1), event(2)})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if r.Outcome != wire.OutcomeRefused || r.Reason != wire.ReasonBodyTooLarge || r.Status != 413 || r.Sequence != int64(i+1) {
			t.Fatalf("result %d: %+v", i, r)
		}
	}
	// Nothing was retained, so both sequences are used again.
	rs, err = p.SendBatch(context.Background(), []Event{event(3), event(4)})
	if err != nil || rs[0].Sequence != 1 || rs[1].Sequence != 2 || rs[1].Cursor != 2 {
		t.Fatalf("%+v %v", rs, err)
	}
}

func TestNewRefusesBadArguments(t *testing.T) {
	s := testSigner(t)
	store := WithStore(&MemoryStore{})
	cases := map[string]func() error{
		"http to a remote host": func() error {
			_, err := New("http://ingest.example.com", "tok", s, WithStream(testStream), store)
			return err
		},
		"user info": func() error {
			_, err := New("https://u:p@ingest.example.com", "tok", s, WithStream(testStream), store)
			return err
		},
		"query": func() error {
			_, err := New("https://ingest.example.com/?a=b", "tok", s, WithStream(testStream), store)
			return err
		},
		"no scheme": func() error { _, err := New("ingest.example.com", "tok", s, WithStream(testStream), store); return err },
		"empty credential": func() error {
			_, err := New("https://ingest.example.com", "", s, WithStream(testStream), store)
			return err
		},
		"credential with space": func() error {
			_, err := New("https://ingest.example.com", "a b", s, WithStream(testStream), store)
			return err
		},
		"no signer": func() error {
			_, err := New("https://ingest.example.com", "tok", nil, WithStream(testStream), store)
			return err
		},
		"bad stream": func() error {
			_, err := New("https://ingest.example.com", "tok", s, WithStream(Stream{"t", "p", "-x"}), store)
			return err
		},
		"no stream": func() error { _, err := New("https://ingest.example.com", "tok", s, store); return err },
		"no store": func() error {
			_, err := New("https://ingest.example.com", "tok", s, WithStream(testStream))
			return err
		},
		"bad deadline": func() error {
			_, err := New("https://ingest.example.com", "tok", s, WithStream(testStream), store, WithDeadline(0))
			return err
		},
	}
	for name, f := range cases {
		if err := f(); err == nil {
			t.Errorf("%s: accepted", name)
		} else if bytes.Contains([]byte(err.Error()), []byte("u:p")) {
			t.Errorf("%s: error echoes the URL's user info", name)
		}
	}
	if _, err := New("http://127.0.0.1:8080/", "tok", s, WithStream(testStream), store); err != nil {
		t.Errorf("loopback http refused: %v", err)
	}
}

func TestBackoffHonoursRetryAfterAndIsCappedWithJitter(t *testing.T) {
	resp := &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"7"}}}
	if d := backoff(time.Millisecond, time.Second, 0, resp); d != 7*time.Second {
		t.Fatalf("429 Retry-After 7: waited %v", d)
	}
	resp.StatusCode = 503
	if d := backoff(time.Millisecond, time.Second, 0, resp); d != 7*time.Second {
		t.Fatalf("503 Retry-After 7: waited %v", d)
	}
	for attempt := 0; attempt < 100; attempt++ {
		d := backoff(100*time.Millisecond, 2*time.Second, attempt, nil)
		want := min(100*time.Millisecond<<min(attempt, 20), 2*time.Second)
		if d < want/2 || d > want {
			t.Fatalf("attempt %d: %v outside [%v, %v]", attempt, d, want/2, want)
		}
	}
}

func TestRetryPolicyRetriesOnlyWhatIsSafe(t *testing.T) {
	ctx := context.Background()
	for code, want := range map[int]bool{200: false, 400: false, 401: false, 403: false, 409: false, 413: false, 422: false, 429: true, 500: true, 502: true, 503: true, 504: true} {
		if got, _ := retryable(ctx, &http.Response{StatusCode: code}, nil); got != want {
			t.Errorf("status %d: retry %v, want %v", code, got, want)
		}
	}
	if got, _ := retryable(ctx, nil, errors.New("connection reset")); !got {
		t.Error("a connection error is not retried")
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if got, _ := retryable(done, nil, errors.New("connection reset")); got {
		t.Error("retried after the deadline")
	}
}
