package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

func (f *fixture) postOutboxBatch(token string, body []byte) resp {
	return f.do(req{method: http.MethodPost, path: "/v1/outbox/batch", token: token, body: body})
}

func outboxBatchBody(items ...[]byte) []byte {
	return []byte(`{"messages":[` + string(bytes.Join(items, []byte(","))) + `]}`)
}

// batchItem is one result of POST /v1/outbox/batch: an enqueue answer or a
// refusal, plus its status.
type batchItem struct {
	Envelope   json.RawMessage `json:"envelope"`
	MessageIDs []string        `json:"message_ids"`
	// A repeat whose envelope body expired (§8.9).
	PayloadExpired bool         `json:"payload_expired"`
	Outcome        wire.Outcome `json:"outcome"`
	Reason         wire.Reason  `json:"reason"`
	CorrelationID  string       `json:"correlation_id"`
	Detail         string       `json:"detail"`
	Status         int          `json:"status"`
}

func (o *outboxFixture) batchResults(r resp) []batchItem {
	o.t.Helper()
	if r.status != http.StatusOK {
		o.t.Fatalf("batch status %d: %s", r.status, r.body)
	}
	var out struct {
		Results []batchItem `json:"results"`
	}
	decodeStrict(o.t, r.body, &out)
	for i, it := range out.Results {
		if it.Reason != "" && (it.Outcome != outcomeRefused || it.CorrelationID != r.header.Get("X-Correlation-Id") ||
			it.Envelope != nil || it.Status != it.Reason.Status()) {
			o.t.Fatalf("result %d is not a refusal body: %+v", i, it)
		}
		if it.Reason != "" {
			checkDetail(o.t, it.Status, it.Detail, r.body)
		} else if it.Detail != "" {
			o.t.Fatalf("result %d is no refusal but has a detail: %+v", i, it)
		}
	}
	return out.Results
}

// sequenceOf is the sequence of an answered envelope.
func sequenceOf(t testing.TB, raw json.RawMessage) int64 {
	t.Helper()
	env, err := envelope.Parse(raw)
	if err != nil {
		t.Fatalf("envelope %s: %v", raw, err)
	}
	return env.Sequence
}

// Each item is answered as POST /v1/outbox would have answered it, had the
// items been sent one by one in order; the created ones take consecutive
// sequences in request order.
func TestOutboxBatchAnswersAsOneByOne(t *testing.T) {
	o := newOutboxFixture(t)
	stored, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-stored", "x")), http.StatusCreated, o.pub) // sequence 1
	noEndpoint := []byte(`{"project_id":"proj-1","topic":"task.none","idempotency_key":"k-ne","kind":"proposal","payload":{}}`)
	r := o.postOutboxBatch(o.service, outboxBatchBody(
		outboxBody("k-1", "a"),       // 0 created, sequence 2
		outboxBody("k-1", "a"),       // 1 repeat of 0
		outboxBody("k-1", "b"),       // 2 idempotency_conflict
		outboxBody("k-stored", "x"),  // 3 repeat of the stored one
		noEndpoint,                   // 4 no_endpoint
		[]byte(`7`),                  // 5 not an object
		[]byte(`{"project_id":"p"}`), // 6 malformed request
		outboxBody("k-2", "c"),       // 7 created, sequence 3
	))
	res := o.batchResults(r)
	if len(res) != 8 {
		t.Fatalf("%d results, want 8", len(res))
	}
	for i, want := range []struct {
		status int
		reason wire.Reason
	}{{201, ""}, {200, ""}, {422, reasonIdempotencyConflict}, {200, ""}, {422, reasonNoEndpoint},
		{400, reasonInvalidRequest}, {400, reasonInvalidRequest}, {201, ""}} {
		if res[i].Status != want.status || res[i].Reason != want.reason {
			t.Fatalf("result %d: %d %q, want %d %q", i, res[i].Status, res[i].Reason, want.status, want.reason)
		}
	}
	if sequenceOf(t, res[0].Envelope) != 2 || sequenceOf(t, res[7].Envelope) != 3 {
		t.Fatalf("sequences %d and %d, want 2 and 3", sequenceOf(t, res[0].Envelope), sequenceOf(t, res[7].Envelope))
	}
	if !bytes.Equal(res[1].Envelope, res[0].Envelope) || !slices.Equal(res[1].MessageIDs, res[0].MessageIDs) ||
		!bytes.Equal(res[3].Envelope, stored.Envelope) || !slices.Equal(res[3].MessageIDs, stored.MessageIDs) {
		t.Fatal("a repeat did not answer the original envelope and ids")
	}
	// The batch's envelopes are the ones stored: a lone repeat answers them
	// byte for byte, and the stream goes on at 4.
	again, _ := o.enqueued(o.postOutbox(o.service, outboxBody("k-2", "c")), http.StatusOK, o.pub)
	if !bytes.Equal(again.Envelope, res[7].Envelope) {
		t.Fatal("a lone repeat of a batch item answered another envelope")
	}
	_, env := o.enqueued(o.postOutbox(o.service, outboxBody("k-3", "d")), http.StatusCreated, o.pub)
	if env.Sequence != 4 {
		t.Fatalf("next sequence %d, want 4", env.Sequence)
	}
	if n := o.count(`SELECT count(*) FROM outbox_messages`); n != 8 {
		t.Fatalf("%d messages, want 8 (4 envelopes, 2 endpoints)", n)
	}
}

// A malformed wrapper is the whole request's 400 invalid_request (a body over
// the limit its 413), and nothing is stored.
func TestOutboxBatchWrapperRefusals(t *testing.T) {
	o := newOutboxFixture(t)
	item := outboxBody("k-1", "a")
	hundredOne := make([][]byte, envelope.MaxBatch+1)
	for i := range hundredOne {
		hundredOne[i] = outboxBody(fmt.Sprintf("k-%d", i), "a")
	}
	cases := map[string][]byte{
		"empty body":        nil,
		"not json":          []byte(`{"messages":[`),
		"array":             []byte(`[` + string(item) + `]`),
		"no messages":       []byte(`{}`),
		"other member":      []byte(`{"messages":[` + string(item) + `],"x":1}`),
		"envelopes":         []byte(`{"envelopes":[` + string(item) + `]}`),
		"duplicate member":  []byte(`{"messages":[` + string(item) + `],"messages":[` + string(item) + `]}`),
		"messages object":   []byte(`{"messages":` + string(item) + `}`),
		"no items":          []byte(`{"messages":[]}`),
		"101 items":         outboxBatchBody(hundredOne...),
		"trailing data":     []byte(`{"messages":[` + string(item) + `]} x`),
		"messages is null":  []byte(`{"messages":null}`),
		"wrapper not utf-8": []byte("{\"m\xffessages\":[]}"),
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			wantRefusal(t, o.postOutboxBatch(o.service, body), http.StatusBadRequest, string(reasonInvalidRequest))
		})
	}
	big := outboxBatchBody(outboxBody("k-big", strings.Repeat("x", envelope.DefaultLimits().MaxBytes)))
	wantRefusal(t, o.postOutboxBatch(o.service, big), http.StatusRequestEntityTooLarge, string(reasonBodyTooLarge))
	wantRefusal(t, o.postOutboxBatch(o.device, outboxBatchBody(item)), http.StatusForbidden, string(reasonForbidden))
	wantRefusal(t, o.postOutboxBatch("nope", outboxBatchBody(item)), http.StatusUnauthorized, string(reasonUnauthenticated))
	if n := o.count(`SELECT count(*) FROM outbound_envelopes`) + o.count(`SELECT count(*) FROM outbound_streams`); n != 0 {
		t.Fatalf("refused batches stored %d rows", n)
	}
	// Exactly 100 is a batch.
	if res := o.batchResults(o.postOutboxBatch(o.service, outboxBatchBody(hundredOne[:100]...))); len(res) != 100 ||
		sequenceOf(t, res[99].Envelope) != 100 {
		t.Fatalf("a batch of 100: %d results", len(res))
	}
}

// One outbox-limiter token per message: a batch the limiter runs out in
// answers its remaining items rate_limited, and a batch whose first item
// finds no token is the whole request's 429.
func TestOutboxBatchTakesOneTokenPerMessage(t *testing.T) {
	o := newOutboxFixture(t, func(c *Config) {
		c.OutboxLimit = limiter.Policy{Tokens: 3, Interval: time.Hour}
	})
	res := o.batchResults(o.postOutboxBatch(o.service, outboxBatchBody(
		outboxBody("k-1", "a"), outboxBody("k-2", "a"), outboxBody("k-3", "a"), outboxBody("k-4", "a"), outboxBody("k-5", "a"))))
	for i, it := range res {
		want := http.StatusCreated
		if i >= 3 {
			want = http.StatusTooManyRequests
		}
		if it.Status != want {
			t.Fatalf("item %d: status %d, want %d", i, it.Status, want)
		}
	}
	r := o.postOutboxBatch(o.service, outboxBatchBody(outboxBody("k-6", "a")))
	wantRefusal(t, r, http.StatusTooManyRequests, string(reasonRateLimited))
	if r.header.Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	if n := o.count(`SELECT count(*) FROM outbound_envelopes`); n != 3 {
		t.Fatalf("%d envelopes stored, want 3", n)
	}
}

// A tenant without an outbound key gets no_signing_key for each well-formed
// item; malformed ones are still invalid_request.
func TestOutboxBatchNoSigningKey(t *testing.T) {
	o := newOutboxFixture(t)
	other := o.issue("tenant-b", "acct-b", "svc-b", store.RoleService)
	res := o.batchResults(o.postOutboxBatch(other, outboxBatchBody(outboxBody("k-1", "a"), []byte(`"x"`))))
	if res[0].Reason != reasonNoSigningKey || res[1].Reason != reasonInvalidRequest {
		t.Fatalf("results %+v", res)
	}
}

// Group commit (contract §8.6): 64 concurrent requests of one credential,
// with repeats and refusals among them, leave the stream's sequences
// contiguous from 1, one per created envelope; a request sent after another
// was answered takes a later sequence (arrival order); and requests share
// transactions.
func TestOutboxGroupCommitSequencesContiguous(t *testing.T) {
	o := newOutboxFixture(t)
	const workers, per = 64, 4
	type got struct {
		seq    int64
		status int
	}
	results := make([][]got, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				var body []byte
				switch {
				case w%8 == 1 && i == 1: // a repeat of this worker's first
					body = outboxBody(fmt.Sprintf("k-%d-0", w), "a")
				case w%8 == 2 && i == 1: // a conflict with it
					body = outboxBody(fmt.Sprintf("k-%d-0", w), "other")
				case w%8 == 3 && i == 1:
					body = []byte(`{"project_id":"proj-1","topic":"task.none","idempotency_key":"k-ne","kind":"proposal","payload":{}}`)
				default:
					body = outboxBody(fmt.Sprintf("k-%d-%d", w, i), "a")
				}
				r := o.postOutbox(o.service, body)
				g := got{status: r.status}
				if r.status == http.StatusCreated || r.status == http.StatusOK {
					var a outboxAnswer
					if err := json.Unmarshal(r.body, &a); err != nil {
						t.Error(err)
						return
					}
					g.seq = sequenceOf(t, a.Envelope)
				}
				results[w] = append(results[w], g)
			}
		}()
	}
	wg.Wait()
	var created []int64
	for w, rs := range results {
		last := int64(0)
		for i, g := range rs {
			switch {
			case g.status == http.StatusCreated:
				created = append(created, g.seq)
				if g.seq <= last {
					t.Fatalf("worker %d request %d: sequence %d after %d, out of arrival order", w, i, g.seq, last)
				}
				last = g.seq
			case g.status == http.StatusOK && w%8 == 1 && i == 1:
			case g.status == http.StatusUnprocessableEntity && (w%8 == 2 || w%8 == 3) && i == 1:
			default:
				t.Fatalf("worker %d request %d: status %d", w, i, g.status)
			}
		}
	}
	slices.Sort(created)
	for i, s := range created {
		if s != int64(i+1) {
			t.Fatalf("created sequences %v are not 1..%d", created, len(created))
		}
	}
	if want := workers*per - 3*workers/8; len(created) != want {
		t.Fatalf("%d created, want %d", len(created), want)
	}
	if n := o.count(`SELECT last_sequence FROM outbound_streams`); n != len(created) {
		t.Fatalf("stream at %d, want %d: a refusal or repeat took a sequence", n, len(created))
	}
	// Every request reached the store, in fewer transactions than requests.
	txs, items := o.histogram("envelopeworker_ingest_outbox_group_commit_items")
	if items != workers*per || int(txs) >= items {
		t.Fatalf("%d requests committed in %d transactions; want %d in fewer", items, txs, workers*per)
	}
}

// histogram is the sample count and sum of a histogram without labels.
func (f *fixture) histogram(name string) (count uint64, sum int) {
	f.t.Helper()
	mfs, err := f.reg.Gather()
	if err != nil {
		f.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			h := mf.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), int(h.GetSampleSum())
		}
	}
	f.t.Fatalf("no histogram %s", name)
	return 0, 0
}
