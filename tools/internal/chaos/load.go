package chaos

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer"
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
	// ClientErrors are what stopped a device before the run's end: a refused stream read, a state that
	// could not be saved, an answer to a sequence that was never saved.
	ClientErrors []string
}

// check5xx remembers a 5xx answer that does not say unavailable.
func (l *Ledger) check5xx(route string, status int, body []byte) {
	var a wire.Answer
	if err := json.Unmarshal(body, &a); err == nil && a.Outcome == wire.OutcomeRefused && a.Reason == wire.ReasonUnavailable {
		return
	}
	l.bad5xx(fmt.Sprintf("%s %d %.200q", route, status, body))
}

// check5xxAnswer is check5xx for an answer the producer SDK parsed; one that did not parse is empty,
// so it is remembered too.
func (l *Ledger) check5xxAnswer(route string, status int, a wire.Answer) {
	if a.Outcome == wire.OutcomeRefused && a.Reason == wire.ReasonUnavailable {
		return
	}
	l.bad5xx(fmt.Sprintf("%s %d outcome %q reason %q", route, status, a.Outcome, a.Reason))
}

func (l *Ledger) bad5xx(what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.Bad5xx) < 100 {
		l.Bad5xx = append(l.Bad5xx, what)
	}
}

// clientError remembers what stopped a device's traffic early, which a valid client must never meet.
func (l *Ledger) clientError(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.ClientErrors) < 100 {
		l.ClientErrors = append(l.ClientErrors, fmt.Sprintf(format, args...))
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
	cfg       loadConfig
	ledger    *Ledger
	client    *http.Client // the outbox clients'
	devices   *http.Client // the producers': each request to the next replica
	transport *http.Transport
	rr        atomic.Uint64
}

func newLoad(cfg loadConfig, ledger *Ledger) *load {
	l := &load{cfg: cfg, ledger: ledger, transport: &http.Transport{MaxIdleConnsPerHost: 16,
		IdleConnTimeout: 30 * time.Second, DisableCompression: true, Proxy: nil}}
	noRedirect := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	l.client = &http.Client{Timeout: 5 * time.Second, Transport: l.transport, CheckRedirect: noRedirect}
	l.devices = &http.Client{Timeout: 5 * time.Second, Transport: replicas{l}, CheckRedirect: noRedirect}
	return l
}

func (l *load) replica() string {
	urls := l.cfg.URLs()
	return urls[l.rr.Add(1)%uint64(len(urls))]
}

func (l *load) url(route string) string { return l.replica() + route }

// replicas sends each request to the next ingest replica in turn: the producer SDK has one base URL,
// and the chaos load must spread over every replica as a load balancer would.
type replicas struct{ l *load }

func (r replicas) RoundTrip(req *http.Request) (*http.Response, error) {
	u, err := url.Parse(r.l.replica())
	if err != nil {
		return nil, fmt.Errorf("replica url: %w", err)
	}
	req = req.Clone(req.Context())
	req.URL.Scheme, req.URL.Host, req.Host = u.Scheme, u.Host, ""
	return r.l.transport.RoundTrip(req)
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
	l.transport.CloseIdleConnections()
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

// record counts one answer for s. A 429 or 5xx (whole request or batch item) and a transport error are
// no answer: the producer sends the envelope again.
func (l *load) record(s *SentEnvelope, a wire.BatchResult, status int) {
	l.ledger.mu.Lock()
	defer l.ledger.mu.Unlock()
	switch {
	case status == http.StatusOK && (a.Outcome == wire.OutcomeAccepted || a.Outcome == wire.OutcomeDuplicate):
		if s.Acks > 0 && a.Outcome == wire.OutcomeAccepted {
			s.Twice = true
		}
		if a.Outcome == wire.OutcomeDuplicate {
			// Shown in the summary: the resends after a simulated crash are being made.
			l.ledger.Statuses["duplicate answers"]++
		}
		s.Outcome = string(a.Outcome)
		s.Acks++
		if a.Cursor != nil && *a.Cursor > s.MaxCursor {
			s.MaxCursor = *a.Cursor
		}
	case status >= 500 || status == 0 || status == http.StatusTooManyRequests:
		s.Failures++
	default:
		reason := a.Reason
		if a.Outcome == "" {
			reason = "unreadable_answer"
		}
		s.Outcome = "refused:" + strconv.Itoa(status) + ":" + string(reason)
	}
}

// device is one producer's stream as the chaos clients drive it: the producer SDK signs, numbers,
// saves and sends, and device records every envelope it saves and every answer it observes.
type device struct {
	l     *load
	cred  ProducerCred
	drain context.Context
	// bySeq is the envelope last saved at each sequence: a sequence refused without retention is used
	// again by the next event, and from then on its answers are that envelope's.
	bySeq map[int64]*SentEnvelope
	// sent is the state saved before the latest send: the envelopes of that send still pending, as a
	// device that crashed before the answer would find them.
	sent producer.State
}

// deviceStore is a MemoryStore that shows the device every state the producer saves.
type deviceStore struct {
	producer.MemoryStore
	d *device
}

func (s *deviceStore) Save(ctx context.Context, st producer.State) error {
	if err := s.d.saved(st); err != nil {
		return err
	}
	return s.MemoryStore.Save(ctx, st)
}

// saved adds to the ledger every envelope the producer is about to send for the first time.
func (d *device) saved(st producer.State) error {
	fresh := false
	for _, pd := range st.Pending {
		if s := d.bySeq[pd.Sequence]; s != nil && bytes.Equal(s.Canonical, pd.Envelope) {
			continue
		}
		e, err := envelope.Parse(pd.Envelope)
		if err != nil {
			return fmt.Errorf("chaos: the producer saved an envelope it cannot have signed: %w", err)
		}
		s := &SentEnvelope{Producer: d.cred.Device, Project: d.l.cfg.Project, Sequence: pd.Sequence,
			EventIdentity: e.EventIdentity(), ContentDigest: e.ContentDigest(), Canonical: bytes.Clone(pd.Envelope)}
		d.bySeq[pd.Sequence] = s
		d.l.ledger.mu.Lock()
		d.l.ledger.Envelopes = append(d.l.ledger.Envelopes, s)
		d.l.ledger.mu.Unlock()
		fresh = true
	}
	if fresh {
		d.sent = producer.State{Last: st.Last, Free: slices.Clone(st.Free), Pending: slices.Clone(st.Pending)}
	}
	return nil
}

// observe records one exchange the producer made.
func (d *device) observe(a producer.Attempt) {
	if d.drain.Err() != nil {
		return // the run is over; an answer cut short by it says nothing
	}
	name := "ingest"
	switch {
	case a.Method == http.MethodGet:
		name = "stream"
	case a.Route == wire.RouteBatch:
		name = "batch"
	}
	d.l.ledger.count(name, a.Status, a.Err)
	if a.Err == nil && a.Status >= 500 {
		d.l.ledger.check5xxAnswer(name, a.Status, a.Answer)
	}
	if a.Method == http.MethodGet {
		if a.Err == nil && a.Status != http.StatusOK && a.Status != http.StatusTooManyRequests && a.Status < 500 {
			d.l.ledger.clientError("%s stream read answered %d %s", d.cred.Device, a.Status, a.Answer.Reason)
		}
		return
	}
	group := make([]*SentEnvelope, len(a.Sequences))
	for i, seq := range a.Sequences {
		if group[i] = d.bySeq[seq]; group[i] == nil {
			d.l.ledger.clientError("%s sent sequence %d without saving it first", d.cred.Device, seq)
			return
		}
	}
	switch {
	case a.Err != nil || a.Status >= 500 || a.Status == http.StatusTooManyRequests:
		for _, s := range group {
			d.l.record(s, wire.BatchResult{}, 0)
		}
	case a.Route != wire.RouteBatch:
		d.l.record(group[0], wire.BatchResult{Answer: a.Answer}, a.Status)
	case a.Status != http.StatusOK || len(a.Results) != len(group):
		for _, s := range group {
			d.l.record(s, wire.BatchResult{Answer: a.Answer}, max(a.Status, 400))
		}
	default:
		for i, s := range group {
			r := a.Results[i]
			if r.Status >= 500 {
				d.l.ledger.check5xxAnswer(name+"-item", r.Status, r.Answer)
			}
			d.l.record(s, r, r.Status)
		}
	}
}

// producer makes the device's producer over st: the chaos run's own client (round-robin over the
// replicas, 5 s per attempt), retrying until the drain ends.
func (d *device) producer(st producer.State) (*producer.Producer, error) {
	signer, err := envelope.NewSigner(d.cred.KeyID, d.cred.Key)
	if err != nil {
		return nil, fmt.Errorf("signer %s: %w", d.cred.Device, err)
	}
	store := &deviceStore{d: d}
	if err := store.MemoryStore.Save(d.drain, st); err != nil {
		return nil, err
	}
	p, err := producer.New(d.l.cfg.URLs()[0], d.cred.Token, signer,
		producer.WithStream(producer.Stream{TenantID: d.l.cfg.Tenant, ProjectID: d.l.cfg.Project, ProducerID: d.cred.Device}),
		producer.WithStore(store),
		producer.WithHTTPClient(d.l.devices),
		producer.WithBackoff(50*time.Millisecond, 500*time.Millisecond),
		producer.WithDeadline(24*time.Hour), // the drain ends retrying
		producer.WithObserver(d.observe))
	if err != nil {
		return nil, fmt.Errorf("producer %s: %w", d.cred.Device, err)
	}
	return p, nil
}

// produce sends one stream in order through the producer SDK: single events, or batches of 5 when
// batch; the SDK retries each request with the same bytes until a definitive answer. After every tenth
// answered send the device restarts as if it had crashed before recording the answer: a fresh producer
// over the state saved before that send re-sends its envelopes byte for byte, which must be duplicates.
func (l *load) produce(stop, drain context.Context, cred ProducerCred, rate float64, batch bool) {
	size := 1
	if batch {
		size = 5
	}
	d := &device{l: l, cred: cred, drain: drain, bySeq: map[int64]*SentEnvelope{}}
	p, err := d.producer(producer.State{})
	if err != nil {
		l.ledger.clientError("%v", err)
		return
	}
	every := time.Duration(float64(time.Second) * float64(size) / rate)
	next := time.Now()
	n := 0
	for sends := 1; stop.Err() == nil; sends++ {
		evs := make([]producer.Event, size)
		for i := range evs {
			n++
			evs[i] = producer.Event{
				EventID: fmt.Sprintf("%s-%d", cred.Device, n), IdempotencyKey: fmt.Sprintf("k-%s-%d", cred.Device, n),
				Metadata: envelope.Metadata{Kind: "chaos.sample"},
				Payload:  fmt.Appendf(nil, `{"device":%q,"n":%d}`, cred.Device, n),
				IssuedAt: time.Now().UTC().Truncate(time.Millisecond),
			}
		}
		if batch {
			_, err = p.SendBatch(drain, evs)
		} else {
			_, err = p.Send(drain, evs[0])
		}
		if err != nil {
			d.failed(err)
			return
		}
		if sends%10 == 0 {
			if p, err = d.producer(d.sent); err == nil {
				_, err = p.Resume(drain)
			}
			if err != nil {
				d.failed(err)
				return
			}
		}
		if !pace(stop, &next, every) {
			break
		}
	}
}

// failed ends a device's traffic: undelivered when the drain ended is the run's end; anything else (a
// refused stream read, a state the producer could not save) is a violation.
func (d *device) failed(err error) {
	if errors.Is(err, producer.ErrUndelivered) && d.drain.Err() != nil {
		return
	}
	d.l.ledger.clientError("%s: %v", d.cred.Device, err)
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
