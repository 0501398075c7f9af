package chaos

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
)

// SentEnvelope is one envelope a client signed and sent, and what the service told it.
type SentEnvelope struct {
	Producer, Project string
	Sequence          int64
	EventIdentity     string   // hex
	ContentDigest     [32]byte // sha256 of the signing input
	Canonical         []byte
	// Outcome is the last definitive answer: "accepted" or "duplicate" (200), "refused:<reason>"
	// (a 4xx), or "" when the client never got one (every answer was a 5xx or a transport error).
	Outcome   string
	Acks      int   // 200 answers
	Twice     bool  // answered accepted after an earlier acknowledgement (a resend must be a duplicate)
	Failures  int   // 5xx answers and transport errors
	MaxCursor int64 // the highest cursor an answer carried
}

// SentOutbox is one POST /v1/outbox request (retried with the same body until it got an answer).
type SentOutbox struct {
	Key        string
	MessageIDs []string // from the first 200/201 answer
	Envelope   []byte   // from the first 200/201 answer
	Answers    int      // 200/201 answers
	Failures   int
	Refusal    string // a 4xx reason, if any
	Mismatch   bool   // a later 2xx answer carried other ids or another envelope
}

// Ledger is what every client was told. It is what the checker holds the database to.
type Ledger struct {
	mu        sync.Mutex
	Envelopes []*SentEnvelope
	Outbox    []*SentOutbox
	Statuses  map[string]int // "ingest 200", "batch 503", "outbox 201", "ingest transport", …
	Requests  int
	// Bad5xx are 5xx answers whose body is not {"outcome":"refused","reason":"unavailable"} (contract
	// §2: a 5xx never says accepted; nothing is acknowledged, retrying is safe).
	Bad5xx []string
}

// check5xx remembers a 5xx answer that does not say unavailable.
func (l *Ledger) check5xx(route string, status int, body []byte) {
	var a wire.Answer
	if err := json.Unmarshal(body, &a); err == nil && a.Outcome == wire.OutcomeRefused && a.Reason == wire.ReasonUnavailable {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.Bad5xx) < 100 {
		l.Bad5xx = append(l.Bad5xx, fmt.Sprintf("%s %d %.200q", route, status, body))
	}
}

func newLedger() *Ledger { return &Ledger{Statuses: map[string]int{}} }

func (l *Ledger) count(route string, status int, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Requests++
	if err != nil {
		l.Statuses[route+" transport"]++
		return
	}
	l.Statuses[route+" "+strconv.Itoa(status)]++
}

// StatusSummary lists the answer counts, sorted by key.
func (l *Ledger) StatusSummary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := make([]string, 0, len(l.Statuses))
	for k := range l.Statuses {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b bytes.Buffer
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s: %d", k, l.Statuses[k])
	}
	return b.String()
}

// answerBody reads both ingest routes' answers: a single answer, or a batch's results.
type answerBody struct {
	wire.BatchResult
	Results []wire.BatchResult `json:"results"`
}

// loadConfig is one scenario's traffic.
type loadConfig struct {
	Tenant, Project string
	Producers       []ProducerCred // device credentials; every fourth one uses the batch route
	Service         string         // service token for the outbox
	Topic           string
	URLs            func() []string // ingest replicas
	Rate            float64         // envelopes per second over all producers
	OutboxRate      float64         // outbox messages per second over all outbox clients
	// OutboxClients share the one service credential (one outbound stream: one busy producer,
	// contract §8.6); every fourth sends batches of outboxBatch on POST /v1/outbox/batch. 0 is 1.
	OutboxClients int
}

// outboxBatch is the size of a batch client's requests.
const outboxBatch = 5

// ProducerCred is one device and its signing key.
type ProducerCred struct {
	Device, KeyID, Token string
	Key                  ed25519.PrivateKey
}

type load struct {
	cfg    loadConfig
	ledger *Ledger
	client *http.Client
	rr     atomic.Uint64
}

func newLoad(cfg loadConfig, ledger *Ledger) *load {
	return &load{cfg: cfg, ledger: ledger, client: &http.Client{
		Timeout: 5 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: 30 * time.Second,
			DisableCompression: true, Proxy: nil},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
}

func (l *load) url(route string) string {
	urls := l.cfg.URLs()
	return urls[l.rr.Add(1)%uint64(len(urls))] + route
}

// run sends traffic until stop ends, then finishes every request in hand (retrying until an answer)
// until drain ends. It returns when every client is done.
func (l *load) run(stop, drain context.Context) {
	var wg sync.WaitGroup
	per := l.cfg.Rate / float64(len(l.cfg.Producers))
	for i, p := range l.cfg.Producers {
		batch := i%4 == 3
		wg.Go(func() { l.produce(stop, drain, p, per, batch) })
	}
	if l.cfg.OutboxRate > 0 {
		clients := max(l.cfg.OutboxClients, 1)
		for c := range clients {
			if c%4 == 3 {
				wg.Go(func() { l.enqueueBatches(stop, drain, c, l.cfg.OutboxRate/float64(clients)) })
			} else {
				wg.Go(func() { l.enqueue(stop, drain, c, l.cfg.OutboxRate/float64(clients)) })
			}
		}
	}
	wg.Wait()
	l.client.CloseIdleConnections()
}

func pace(ctx context.Context, next *time.Time, every time.Duration) bool {
	*next = next.Add(every)
	if d := time.Until(*next); d > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
		}
	} else if d < -time.Second {
		*next = time.Now() // do not burst to catch up after a stall
	}
	return ctx.Err() == nil
}

// backoff waits a little before a retry; false when ctx ended.
func backoff(ctx context.Context, try int) bool {
	d := time.Duration(min(50*(1<<min(try, 4)), 500)) * time.Millisecond
	select {
	case <-ctx.Done():
		return false
	case <-time.After(d):
		return true
	}
}

func (l *load) sign(p ProducerCred, seq int64) (*SentEnvelope, error) {
	payload, err := json.Marshal(map[string]any{"n": seq, "device": p.Device})
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	e, err := envelope.Sign(envelope.Draft{
		TenantID: l.cfg.Tenant, ProjectID: l.cfg.Project, ProducerID: p.Device,
		EventID: fmt.Sprintf("%s-%d", p.Device, seq), IdempotencyKey: fmt.Sprintf("k-%s-%d", p.Device, seq),
		KeyID: p.KeyID, Sequence: seq, IssuedAt: time.Now().UTC().Truncate(time.Millisecond),
		Metadata: envelope.Metadata{Kind: "chaos.sample"}, Payload: payload,
	}, p.Key)
	if err != nil {
		return nil, fmt.Errorf("sign %s/%d: %w", p.Device, seq, err)
	}
	return &SentEnvelope{Producer: p.Device, Project: l.cfg.Project, Sequence: seq,
		EventIdentity: e.EventIdentity(), ContentDigest: e.ContentDigest(), Canonical: e.Canonical()}, nil
}

func (l *load) record(s *SentEnvelope, a wire.BatchResult, status int) {
	l.ledger.mu.Lock()
	defer l.ledger.mu.Unlock()
	switch {
	case status == http.StatusOK && (a.Outcome == wire.OutcomeAccepted || a.Outcome == wire.OutcomeDuplicate):
		if s.Acks > 0 && a.Outcome == wire.OutcomeAccepted {
			s.Twice = true
		}
		s.Outcome = string(a.Outcome)
		s.Acks++
		if a.Cursor != nil && *a.Cursor > s.MaxCursor {
			s.MaxCursor = *a.Cursor
		}
	case status >= 500 || status == 0:
		s.Failures++
	default:
		s.Outcome = "refused:" + strconv.Itoa(status) + ":" + string(a.Reason)
	}
}

// produce sends one stream in order: singles, or batches of 5 when batch. Each request is retried with
// the same bytes until a definitive answer; every tenth envelope is sent once more, which must be a
// duplicate.
func (l *load) produce(stop, drain context.Context, p ProducerCred, rate float64, batch bool) {
	size := 1
	if batch {
		size = 5
	}
	every := time.Duration(float64(time.Second) * float64(size) / rate)
	next := time.Now()
	seq := int64(1)
	for stop.Err() == nil {
		group := make([]*SentEnvelope, 0, size)
		for range size {
			s, err := l.sign(p, seq)
			if err != nil {
				return
			}
			seq++
			group = append(group, s)
		}
		l.ledger.mu.Lock()
		l.ledger.Envelopes = append(l.ledger.Envelopes, group...)
		l.ledger.mu.Unlock()
		l.send(drain, p, group, batch)
		if group[0].Sequence%10 == 0 && group[0].Outcome != "" {
			l.send(drain, p, group, batch)
		}
		if !pace(stop, &next, every) {
			break
		}
	}
}

// send posts group (one envelope, or a batch) until every item has a definitive answer or ctx ends.
func (l *load) send(ctx context.Context, p ProducerCred, group []*SentEnvelope, batch bool) {
	route, name := wire.RouteEnvelopes, "ingest"
	var body []byte
	if batch {
		route, name = wire.RouteBatch, "batch"
		var b bytes.Buffer
		b.WriteString(`{"envelopes":[`)
		for i, s := range group {
			if i > 0 {
				b.WriteByte(',')
			}
			b.Write(s.Canonical)
		}
		b.WriteString(`]}`)
		body = b.Bytes()
	} else {
		body = group[0].Canonical
	}
	for try := 0; ctx.Err() == nil; try++ {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ans, err := access.Post(rctx, l.client, l.url(route), p.Token, body, nil)
		cancel()
		if ctx.Err() != nil {
			return // the run is over; an answer cut short by it says nothing
		}
		l.ledger.count(name, ans.Status, err)
		if err == nil && ans.Status >= 500 {
			l.ledger.check5xx(name, ans.Status, ans.Body)
		}
		if err != nil || ans.Status >= 500 || ans.Status == http.StatusTooManyRequests {
			for _, s := range group {
				l.record(s, wire.BatchResult{}, 0)
			}
			if !backoff(ctx, try) {
				return
			}
			continue
		}
		var a answerBody
		if jerr := json.Unmarshal(ans.Body, &a); jerr != nil {
			a.Outcome, a.Reason = wire.OutcomeRefused, "unreadable_answer"
		}
		if !batch {
			l.record(group[0], a.BatchResult, ans.Status)
			return
		}
		if ans.Status != http.StatusOK || len(a.Results) != len(group) {
			for _, s := range group {
				l.record(s, a.BatchResult, max(ans.Status, 400))
			}
			return
		}
		for i, s := range group {
			l.record(s, a.Results[i], a.Results[i].Status)
		}
		return
	}
}

func (l *load) outboxBody(key string, n int) []byte {
	return fmt.Appendf(nil, `{"project_id":%q,"topic":%q,"idempotency_key":%q,"kind":"chaos.tick","payload":{"n":%d},"max_attempts":50}`,
		l.cfg.Project, l.cfg.Topic, key, n)
}

// enqueue is one outbox client: requests one at a time at rate messages/s, each retried with the same
// body until it gets an answer.
func (l *load) enqueue(stop, drain context.Context, client int, rate float64) {
	every := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	for n := 1; stop.Err() == nil; n++ {
		o := &SentOutbox{Key: fmt.Sprintf("ob-%d-%d", client, n)}
		body := l.outboxBody(o.Key, n)
		l.ledger.mu.Lock()
		l.ledger.Outbox = append(l.ledger.Outbox, o)
		l.ledger.mu.Unlock()
		l.postOutbox(drain, o, body)
		if n%10 == 0 && o.Answers > 0 {
			l.postOutbox(drain, o, body) // a repeat: the original answer again
		}
		if !pace(stop, &next, every) {
			break
		}
	}
}

// enqueueBatches is one outbox client on the batch route: outboxBatch messages a request, at rate
// messages/s, each request retried with the same body until every item has an answer.
func (l *load) enqueueBatches(stop, drain context.Context, client int, rate float64) {
	every := time.Duration(float64(time.Second) * outboxBatch / rate)
	next := time.Now()
	for n := 1; stop.Err() == nil; n++ {
		sent := make([]*SentOutbox, outboxBatch)
		bodies := make([][]byte, outboxBatch)
		for i := range sent {
			sent[i] = &SentOutbox{Key: fmt.Sprintf("ob-%d-%d-%d", client, n, i)}
			bodies[i] = l.outboxBody(sent[i].Key, n)
		}
		l.ledger.mu.Lock()
		l.ledger.Outbox = append(l.ledger.Outbox, sent...)
		l.ledger.mu.Unlock()
		body := append(append([]byte(`{"messages":[`), bytes.Join(bodies, []byte(","))...), ']', '}')
		l.postOutboxBatch(drain, sent, body)
		if !pace(stop, &next, every) {
			break
		}
	}
}

func (l *load) postOutboxBatch(ctx context.Context, sent []*SentOutbox, body []byte) {
	for try := 0; ctx.Err() == nil; try++ {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ans, err := access.Post(rctx, l.client, l.url(wire.RouteOutboxBatch), l.cfg.Service, body, nil)
		cancel()
		if ctx.Err() != nil {
			return
		}
		l.ledger.count("outbox-batch", ans.Status, err)
		if err == nil && ans.Status >= 500 {
			l.ledger.check5xx("outbox-batch", ans.Status, ans.Body)
		}
		var a wire.EnqueueBatchAnswer
		if err == nil && ans.Status == http.StatusOK {
			_ = json.Unmarshal(ans.Body, &a)
		}
		retry := err != nil || ans.Status >= 500 || ans.Status == http.StatusTooManyRequests
		if !retry && ans.Status == http.StatusOK && len(a.Results) != len(sent) {
			retry = true
		}
		for _, r := range a.Results {
			if r.Status >= 500 || r.Status == http.StatusTooManyRequests {
				retry = true
			}
		}
		l.ledger.mu.Lock()
		if retry {
			for _, o := range sent {
				o.Failures++
			}
			l.ledger.mu.Unlock()
			if !backoff(ctx, try) {
				return
			}
			continue
		}
		defer l.ledger.mu.Unlock()
		if ans.Status != http.StatusOK {
			var ref wire.Answer
			_ = json.Unmarshal(ans.Body, &ref)
			for _, o := range sent {
				o.Refusal = strconv.Itoa(ans.Status) + ":" + string(ref.Reason)
			}
			return
		}
		for i, r := range a.Results {
			o := sent[i]
			if r.Status != http.StatusOK && r.Status != http.StatusCreated {
				o.Refusal = strconv.Itoa(r.Status) + ":" + string(r.Reason)
				continue
			}
			if o.Answers == 0 {
				o.MessageIDs, o.Envelope = r.MessageIDs, r.Envelope
			} else if !equalStrings(o.MessageIDs, r.MessageIDs) || !bytes.Equal(o.Envelope, r.Envelope) {
				o.Mismatch = true
			}
			o.Answers++
		}
		return
	}
}

func (l *load) postOutbox(ctx context.Context, o *SentOutbox, body []byte) {
	for try := 0; ctx.Err() == nil; try++ {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		ans, err := access.Post(rctx, l.client, l.url(wire.RouteOutbox), l.cfg.Service, body, nil)
		cancel()
		if ctx.Err() != nil {
			return
		}
		l.ledger.count("outbox", ans.Status, err)
		if err == nil && ans.Status >= 500 {
			l.ledger.check5xx("outbox", ans.Status, ans.Body)
		}
		if err != nil || ans.Status >= 500 || ans.Status == http.StatusTooManyRequests {
			l.ledger.mu.Lock()
			o.Failures++
			l.ledger.mu.Unlock()
			if !backoff(ctx, try) {
				return
			}
			continue
		}
		var a wire.EnqueueResult
		_ = json.Unmarshal(ans.Body, &a)
		l.ledger.mu.Lock()
		defer l.ledger.mu.Unlock()
		if ans.Status != http.StatusOK && ans.Status != http.StatusCreated {
			o.Refusal = strconv.Itoa(ans.Status) + ":" + string(a.Reason)
			return
		}
		if o.Answers == 0 {
			o.MessageIDs, o.Envelope = a.MessageIDs, a.Envelope
		} else if !equalStrings(o.MessageIDs, a.MessageIDs) || !bytes.Equal(o.Envelope, a.Envelope) {
			o.Mismatch = true
		}
		o.Answers++
		return
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func hexDigest(d [32]byte) string { return hex.EncodeToString(d[:]) }
