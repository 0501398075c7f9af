package producer

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// cannedTransport answers the stream read with an empty stream, the first
// POST with the fuzzed answer, and every later POST with a plain refusal, so
// that retries end at once.
type cannedTransport struct {
	status int
	body   []byte
	posts  atomic.Int64
}

func (c *cannedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	resp := func(status int, body []byte) *http.Response {
		return &http.Response{StatusCode: status, Header: http.Header{}, Body: io.NopCloser(bytes.NewReader(body)), Request: r}
	}
	if r.Method == http.MethodGet {
		return resp(200, []byte(`{"cursor":0,"replay_floor":0}`)), nil
	}
	if c.posts.Add(1) == 1 {
		return resp(c.status, c.body), nil
	}
	return resp(400, []byte(`{"outcome":"refused","reason":"invalid_envelope","correlation_id":"x"}`)), nil
}

// FuzzAnswers feeds the producer arbitrary answers: it must never panic,
// never call an envelope delivered unless its answer said so with a 200,
// and keep every envelope without a definite answer pending.
func FuzzAnswers(f *testing.F) {
	f.Add(200, []byte(`{"outcome":"accepted","cursor":1,"correlation_id":"c"}`), false)
	f.Add(200, []byte(`{"results":[{"outcome":"accepted","cursor":1,"status":200},{"outcome":"refused","reason":"rate_limited","status":429}]}`), true)
	f.Add(503, []byte(`{"outcome":"accepted"}`), false)
	f.Add(409, []byte(`{"outcome":"refused","reason":"sequence_conflict"}`), true)
	f.Add(200, []byte(`{"results":[{"outcome":"duplicate","status":500}]}`), true)
	f.Add(200, []byte(`not json`), false)
	f.Add(302, []byte(``), false)
	f.Fuzz(func(t *testing.T, status int, body []byte, batch bool) {
		if status < 100 || status > 599 {
			status = 100 + (status%500+500)%500
		}
		ct := &cannedTransport{status: status, body: body}
		store := &MemoryStore{}
		p, err := New("http://127.0.0.1:1", "tok", testSigner(t), WithStream(testStream), WithStore(store),
			WithHTTPClient(&http.Client{Transport: ct}), WithBackoff(time.Microsecond, time.Microsecond), WithDeadline(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		evs := []Event{event(1)}
		if batch {
			evs = append(evs, event(2))
		}
		rs, err := p.SendBatch(context.Background(), evs)
		st, _ := store.Load(context.Background())
		if err != nil {
			if len(st.Pending) == 0 {
				t.Fatalf("error %v but nothing pending", err)
			}
			if strings.Contains(err.Error(), "tok") {
				t.Fatalf("error carries the credential: %v", err)
			}
			return
		}
		if len(rs) != len(evs) {
			t.Fatalf("%d results for %d events", len(rs), len(evs))
		}
		for i, r := range rs {
			if r.Outcome == "" {
				t.Fatalf("result %d has no outcome and no error was returned", i)
			}
			if r.Delivered() && (r.Status != http.StatusOK || (r.Outcome != wire.OutcomeAccepted && r.Outcome != wire.OutcomeDuplicate)) {
				t.Fatalf("result %d delivered with status %d: %+v", i, r.Status, r)
			}
		}
		if len(st.Pending) != 0 {
			t.Fatalf("every envelope answered, yet %d pending", len(st.Pending))
		}
	})
}
