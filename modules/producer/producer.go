package producer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// Stream names the stream a producer writes: the tenant of its credential,
// a project, and its own device id as producer id. The tenant cannot be
// learned from an opaque credential, so the caller states it.
type Stream struct {
	TenantID, ProjectID, ProducerID string
}

// Event is what the caller sends; the producer adds the stream, sequence,
// key id and signature. IdempotencyKey defaults to EventID and IssuedAt to
// the current time.
type Event struct {
	EventID        string
	IdempotencyKey string
	Metadata       envelope.Metadata
	Payload        []byte // one JSON value
	IssuedAt       time.Time
}

// Result is the service's answer for one envelope. Reason and Detail are
// set on refusals only; Cursor on accepted and duplicate answers.
type Result struct {
	Sequence      int64
	EventID       string
	EventIdentity string
	Outcome       wire.Outcome
	Reason        wire.Reason
	Detail        string
	Status        int
	Cursor        int64
	CorrelationID string
}

// Delivered reports whether the service holds the envelope: accepted, or
// a duplicate of one it already held.
func (r Result) Delivered() bool {
	return r.Outcome == wire.OutcomeAccepted || r.Outcome == wire.OutcomeDuplicate
}

// ErrUndelivered means the service gave no answer within the deadline
// (connection errors, timeouts, 429 or 5xx on every attempt). The envelopes
// stay in the SequenceStore and are re-sent, byte for byte, by the next
// Resume, which the next Send runs first.
var ErrUndelivered = errors.New("producer: no answer from the service; the envelopes stay pending")

// RefusalError is a whole request refused by the service, as Resume's
// stream read may be (unauthenticated, forbidden).
type RefusalError struct {
	Status        int
	Reason        wire.Reason
	CorrelationID string
}

func (e *RefusalError) Error() string {
	return fmt.Sprintf("producer: refused: %d %s", e.Status, e.Reason)
}

// Option configures New.
type Option func(*config)

type config struct {
	stream                 Stream
	store                  SequenceStore
	client                 *http.Client
	deadline               time.Duration
	backoffMin, backoffMax time.Duration
	now                    func() time.Time
	observe                func(Attempt)
}

// WithStream sets the stream the producer writes (required: the tenant
// cannot be learned from an opaque credential, and a guessed project or
// producer id would be refused only after the first send).
func WithStream(s Stream) Option { return func(c *config) { c.stream = s } }

// WithStore sets where sequences and unacknowledged envelopes live
// (required: NewFileStore on a device; a MemoryStore forgets, after a
// crash, envelopes the service may hold, and is only for producers that
// never restart, such as load generators).
func WithStore(s SequenceStore) Option { return func(c *config) { c.store = s } }

// WithHTTPClient sets the client for each attempt (its Timeout bounds one
// attempt). Redirects are never followed, whatever the client says: the
// credential must not go where a redirect points.
func WithHTTPClient(h *http.Client) Option { return func(c *config) { c.client = h } }

// WithDeadline bounds one Send, SendBatch or Resume including every retry
// (default 1 minute).
func WithDeadline(d time.Duration) Option { return func(c *config) { c.deadline = d } }

// WithBackoff sets the first and the largest wait between retries (default
// 250ms and 15s); waits double from min, capped at max, with jitter. A
// Retry-After on 429 or 503 is honoured instead.
func WithBackoff(min, max time.Duration) Option {
	return func(c *config) { c.backoffMin, c.backoffMax = min, max }
}

// WithObserver makes the producer call observe with every HTTP exchange it
// makes, retries included, before it acts on the answer: what a test
// harness or a metrics hook needs to see behind Send's single Result.
// observe runs on the sending goroutine and must return quickly.
func WithObserver(observe func(Attempt)) Option { return func(c *config) { c.observe = observe } }

// Attempt is one HTTP exchange, as WithObserver reports it. It never holds
// the credential or a body. Answer is the answer when it parses as one;
// Results is a batch route's 200 answer, one per sequence, whose 429 and
// 5xx items are sent again in a later request. Retry means the same
// request is sent again after a backoff, unless the deadline ends first.
type Attempt struct {
	Method, Route string
	Sequences     []int64 // the envelopes the request carried; none on a stream read
	Status        int     // 0 when Err is set
	Err           error
	Answer        wire.Answer
	Results       []wire.BatchResult
	Retry         bool
}

// WithClock sets the clock issued_at is read from (tests).
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// Producer sends one stream's envelopes. Its methods are safe for
// concurrent use but run one at a time: sequences are assigned and saved in
// order. Use SendBatch for throughput.
type Producer struct {
	base       string
	credential string
	signer     *envelope.Signer
	cfg        config
	http       *retryablehttp.Client

	mu     sync.Mutex
	state  State
	loaded bool
	synced bool // false until Resume succeeded, and again after an undelivered send
}

// New checks its arguments and makes a Producer; it does no I/O. baseURL is
// the service's root (https, or http to a loopback host only: the
// credential must not cross a network in clear text). WithStream and
// WithStore are required.
func New(baseURL, credential string, signer *envelope.Signer, opts ...Option) (*Producer, error) {
	base, err := checkBaseURL(baseURL)
	if err != nil {
		return nil, err
	}
	if credential == "" || strings.IndexFunc(credential, func(r rune) bool { return r < 0x21 || r > 0x7e }) >= 0 {
		return nil, errors.New("producer: credential must be non-empty printable ASCII")
	}
	if signer == nil {
		return nil, errors.New("producer: no signer")
	}
	cfg := config{deadline: time.Minute, backoffMin: 250 * time.Millisecond, backoffMax: 15 * time.Second, now: time.Now}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.stream == (Stream{}) {
		return nil, errors.New("producer: no stream: pass WithStream(Stream{TenantID, ProjectID, ProducerID})")
	}
	for _, id := range []string{cfg.stream.TenantID, cfg.stream.ProjectID, cfg.stream.ProducerID} {
		if !envelope.ValidIdentity(id) {
			return nil, errors.New("producer: stream tenant, project and producer ids must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
		}
	}
	if cfg.store == nil {
		return nil, errors.New("producer: no SequenceStore: pass WithStore(NewFileStore(path))")
	}
	if cfg.deadline <= 0 || cfg.backoffMin <= 0 || cfg.backoffMax < cfg.backoffMin {
		return nil, errors.New("producer: deadline and backoff must be positive, with min <= max")
	}
	hc := &http.Client{Timeout: 15 * time.Second}
	if cfg.client != nil {
		c := *cfg.client
		hc = &c
	}
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	p := &Producer{base: base, credential: credential, signer: signer, cfg: cfg}
	p.http = &retryablehttp.Client{
		HTTPClient:   hc,
		Logger:       nil, // its messages carry URLs and errors; the caller decides what to log
		RetryWaitMin: cfg.backoffMin,
		RetryWaitMax: cfg.backoffMax,
		// The deadline ends retrying; the count only keeps the loop finite.
		RetryMax:     1 << 20,
		CheckRetry:   p.checkRetry,
		Backoff:      backoff,
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
	}
	return p, nil
}

func checkBaseURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Hostname() == "" {
		return "", errors.New("producer: base URL must be an absolute http(s) URL")
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return "", errors.New("producer: base URL must not carry user info, query or fragment")
	}
	if u.Scheme == "http" && !isLoopback(u.Hostname()) {
		return "", errors.New("producer: plain http is allowed to loopback hosts only; use https")
	}
	return strings.TrimRight(u.String(), "/"), nil
}

func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Send signs ev with the next sequence, saves it, and sends it to
// POST /v1/envelopes. A refusal is a Result, returned at once; an error is
// a local one (the event breaks an envelope rule: no sequence is used,
// nothing is sent), ErrUndelivered, or a *RefusalError from the Resume it
// runs first when needed. After ErrUndelivered, call Resume to see the
// answers to the envelopes it re-sends; Send re-sends them without
// reporting them.
func (p *Producer) Send(ctx context.Context, ev Event) (Result, error) {
	rs, err := p.send(ctx, []Event{ev})
	if err != nil {
		return Result{}, err
	}
	return rs[0], nil
}

// SendBatch is Send for 1–100 events in one POST /v1/envelopes/batch, with
// consecutive sequences; results are in the order of evs.
func (p *Producer) SendBatch(ctx context.Context, evs []Event) ([]Result, error) {
	if len(evs) < 1 || len(evs) > envelope.MaxBatch {
		return nil, fmt.Errorf("producer: a batch has 1 to %d events, not %d", envelope.MaxBatch, len(evs))
	}
	return p.send(ctx, evs)
}

// Resume loads the saved state, re-sends every unacknowledged envelope
// byte for byte (a duplicate answer counts as delivered), reads the
// stream's cursor and replay floor from GET /v1/streams/{project}/{producer}
// and continues above them. It returns the answers to the re-sent
// envelopes, so that after a crash the caller learns which of the events it
// was handing over when it died the producer still held (any other must be
// sent again). Send runs it first when it has not succeeded yet.
func (p *Producer) Resume(ctx context.Context) ([]Result, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.deadline)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resume(ctx)
}

func (p *Producer) resume(ctx context.Context) ([]Result, error) {
	if !p.loaded {
		st, err := p.cfg.store.Load(ctx)
		if err != nil {
			return nil, fmt.Errorf("producer: load state: %w", err)
		}
		p.state, p.loaded = st, true
	}
	var resent []Result
	for len(p.state.Pending) > 0 {
		chunk := slices.Clone(p.state.Pending[:min(len(p.state.Pending), envelope.MaxBatch)])
		rs, err := p.deliver(ctx, chunk)
		if serr := p.settle(ctx, chunk, rs); serr != nil {
			return resent, serr
		}
		resent = append(resent, decided(rs)...)
		if err != nil {
			return resent, err
		}
	}
	ss, err := p.readStream(ctx)
	if err != nil {
		return resent, err
	}
	top := max(ss.Cursor, ss.ReplayFloor)
	p.state.Last = max(p.state.Last, top)
	// A free sequence at or below the cursor is held by the service after
	// all (this state is older than the stream): using it would conflict.
	p.state.Free = slices.DeleteFunc(p.state.Free, func(s int64) bool { return s <= top })
	if err := p.save(ctx); err != nil {
		return resent, err
	}
	p.synced = true
	return resent, nil
}

func decided(rs []Result) []Result {
	out := make([]Result, 0, len(rs))
	for _, r := range rs {
		if r.Outcome != "" {
			out = append(out, r)
		}
	}
	return out
}

func (p *Producer) send(ctx context.Context, evs []Event) ([]Result, error) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.deadline)
	defer cancel()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.synced {
		if _, err := p.resume(ctx); err != nil {
			return nil, err
		}
	}
	// Sign everything before anything is saved: an event that breaks a
	// rule uses no sequence and sends nothing.
	next := cloneState(p.state)
	now := p.cfg.now()
	batch := make([]Pending, len(evs))
	for i, ev := range evs {
		seq := next.take()
		body, err := p.sign(ev, seq, now)
		if err != nil {
			if len(evs) == 1 {
				return nil, fmt.Errorf("producer: %w", err)
			}
			return nil, fmt.Errorf("producer: event %d: %w", i, err)
		}
		batch[i] = Pending{Sequence: seq, EventID: ev.EventID, Envelope: body}
	}
	next.Pending = append(next.Pending, batch...)
	slices.SortFunc(next.Pending, func(a, b Pending) int { return int(a.Sequence - b.Sequence) })
	// Written and synced before the first byte is sent: after a crash
	// the envelope the service may hold is still known.
	if err := p.cfg.store.Save(ctx, next); err != nil {
		return nil, fmt.Errorf("producer: save state: %w", err)
	}
	p.state = next
	rs, err := p.deliver(ctx, batch)
	if serr := p.settle(ctx, batch, rs); serr != nil {
		return nil, serr
	}
	if err != nil {
		return nil, err
	}
	return rs, nil
}

// take hands out the lowest free sequence, else the next new one.
func (s *State) take() int64 {
	if len(s.Free) > 0 {
		slices.Sort(s.Free)
		seq := s.Free[0]
		s.Free = s.Free[1:]
		return seq
	}
	s.Last++
	return s.Last
}

func (p *Producer) sign(ev Event, seq int64, now time.Time) ([]byte, error) {
	issued := ev.IssuedAt
	if issued.IsZero() {
		issued = now
	}
	key := ev.IdempotencyKey
	if key == "" {
		key = ev.EventID
	}
	env, err := p.signer.Sign(envelope.Draft{
		TenantID: p.cfg.stream.TenantID, ProjectID: p.cfg.stream.ProjectID, ProducerID: p.cfg.stream.ProducerID,
		EventID: ev.EventID, IdempotencyKey: key, Sequence: seq,
		IssuedAt: issued, Metadata: ev.Metadata, Payload: ev.Payload,
	})
	if err != nil {
		return nil, err
	}
	// Step 4 as the service will judge it, so a refusal that is certain
	// costs no sequence and no request.
	if err := env.Validate(now, 0); err != nil {
		return nil, err
	}
	return env.Canonical(), nil
}

// settle records the answers: a delivered or refused envelope leaves
// Pending; the sequence of one refused without being retained is free
// again, except when the refusal is about the sequence itself.
func (p *Producer) settle(ctx context.Context, batch []Pending, rs []Result) error {
	done := map[int64]bool{}
	for i, r := range rs {
		if r.Outcome == "" {
			p.synced = false
			continue
		}
		seq := batch[i].Sequence
		done[seq] = true
		if r.Outcome == wire.OutcomeRefused {
			switch r.Reason {
			case wire.ReasonSequenceConflict, wire.ReasonBelowReplayFloor:
				// This state is behind the stream: read the cursor again
				// before the next sequence is handed out.
				p.synced = false
			default:
				p.state.Free = append(p.state.Free, seq)
			}
		}
	}
	if rs == nil {
		p.synced = false
	}
	p.state.Pending = slices.DeleteFunc(p.state.Pending, func(pd Pending) bool { return done[pd.Sequence] })
	return p.save(ctx)
}

func (p *Producer) save(ctx context.Context) error {
	// A cancelled caller must not leave acknowledgements unrecorded: they
	// would only cost a duplicate re-send, but saving is cheap.
	if err := p.cfg.store.Save(context.WithoutCancel(ctx), p.state); err != nil {
		return fmt.Errorf("producer: save state: %w", err)
	}
	return nil
}
