package loadgen

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	sdk "github.com/envelopeworker/envelopeworker/modules/producer"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/redact"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
)

// Config describes one run.
type Config struct {
	URL       *url.URL // from access.CheckURL(raw, true)
	Creds     Creds
	Producers int // concurrent producers, at most len(Creds.Producers)
	Count     int // envelopes in all, split evenly over the producers
	// Duration, when positive, stops issuing requests once it has passed (in-flight ones finish).
	Duration time.Duration
	// Rate is the total target in envelopes per second; 0 sends flat out.
	Rate float64
	// Batch is envelopes per request on /v1/envelopes/batch; 0 uses the single route.
	Batch        int
	PayloadBytes int
	// Project is the project id of every stream; empty picks a fresh one, so sequences start at 1.
	Project string
	Timeout time.Duration // per request
	Now     func() time.Time
	// SameCredential sends every client's requests with the first credential: with an outbox
	// credentials file, Producers concurrent clients of one outbound stream (contract §8.6).
	SameCredential bool
	// SDK sends through the producer module (modules/producer) with its in-memory store, as a device
	// would (the file store's fsyncs would measure the generator's disk): each producer signs, numbers
	// and saves its envelopes when it sends them, so that work is inside the clock. Device
	// credentials only.
	SDK bool
}

// Limits of a run's configuration.
const (
	MaxCount        = 10_000_000
	MaxPayloadBytes = 512 << 10
)

type request struct {
	body   []byte
	events []sdk.Event // SDK runs: what one Send or SendBatch hands over
	n      int         // envelopes in body or events
}

// Plan is a run with every envelope already signed.
type Plan struct {
	cfg     Config
	work    [][]request // per producer, in sequence order
	route   string
	clients []string           // token per producer
	outbox  bool               // answers are POST /v1/outbox's: 201 created, 200 repeated
	signers []*envelope.Signer // SDK runs: per producer
}

// NewPlan checks cfg and signs every envelope.
func NewPlan(cfg Config) (*Plan, error) {
	if cfg.URL == nil {
		return nil, errors.New("no URL")
	}
	if !access.IsLoopbackHost(cfg.URL.Hostname()) {
		return nil, fmt.Errorf("url %s: only loopback hosts are allowed", redact.URL(cfg.URL.String()))
	}
	switch {
	case cfg.Producers < 1 || cfg.Producers > len(cfg.Creds.Producers):
		return nil, fmt.Errorf("producers must be 1-%d (the credentials file holds %d)", len(cfg.Creds.Producers), len(cfg.Creds.Producers))
	case cfg.Count < cfg.Producers || cfg.Count > MaxCount:
		return nil, fmt.Errorf("count must be %d-%d (at least one envelope per producer)", cfg.Producers, MaxCount)
	case cfg.Batch < 0 || cfg.Batch > envelope.MaxBatch:
		return nil, fmt.Errorf("batch must be 0 (single route) or 1-%d", envelope.MaxBatch)
	case cfg.Rate < 0:
		return nil, errors.New("rate must not be negative")
	case cfg.Duration < 0:
		return nil, errors.New("duration must not be negative")
	case cfg.PayloadBytes < 0 || cfg.PayloadBytes > MaxPayloadBytes:
		return nil, fmt.Errorf("payload bytes must be 0-%d", MaxPayloadBytes)
	case cfg.Timeout <= 0:
		return nil, errors.New("timeout must be positive")
	case cfg.SameCredential && !cfg.Creds.Outbox:
		return nil, errors.New("same-credential needs an outbox credentials file (a device's envelopes carry their own sequences)")
	case cfg.SDK && cfg.Creds.Outbox:
		return nil, errors.New("sdk needs a device credentials file (the producer module sends envelopes, not outbox requests)")
	}
	if cfg.Creds.Outbox {
		if cfg.Project != "" && cfg.Project != cfg.Creds.Project {
			return nil, fmt.Errorf("an outbox run uses the credentials file's project %s", cfg.Creds.Project)
		}
		cfg.Project = cfg.Creds.Project
		if cfg.Now == nil {
			cfg.Now = time.Now
		}
		return newOutboxPlan(cfg)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Project == "" {
		var b [4]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, fmt.Errorf("random project id: %w", err)
		}
		cfg.Project = "lg-" + hex.EncodeToString(b[:])
	}
	p := &Plan{cfg: cfg, work: make([][]request, cfg.Producers), route: wire.RouteEnvelopes}
	if cfg.Batch > 0 {
		p.route = wire.RouteBatch
	}
	p.clients = make([]string, cfg.Producers)
	issued := cfg.Now().UTC().Truncate(time.Millisecond)
	pad := strings.Repeat("x", cfg.PayloadBytes)

	// Sign on every core: one producer's stream is as parallel as many producers' streams.
	envs := make([][][]byte, cfg.Producers)
	keys := make([]ed25519.PrivateKey, cfg.Producers)
	type job struct{ producer, seq int }
	jobs := make(chan job, 1024)
	for i := range envs {
		n := cfg.Count / cfg.Producers
		if i < cfg.Count%cfg.Producers {
			n++
		}
		envs[i] = make([][]byte, n)
		pr := cfg.Creds.Producers[i]
		if pr.Token == "" || strings.ContainsFunc(pr.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			// The token goes into a header line as it is.
			return nil, fmt.Errorf("producer %s: token is empty or holds spaces or control characters", pr.Device)
		}
		p.clients[i] = pr.Token
		priv, err := access.ParseSeed(pr.Seed)
		if err != nil {
			return nil, fmt.Errorf("producer %s: %w", pr.Device, err)
		}
		keys[i] = priv
	}
	if cfg.SDK {
		return p.sdkPlan(keys, envs, issued, pad)
	}
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				b, err := signOne(cfg, cfg.Creds.Producers[j.producer], keys[j.producer], j.seq, issued, pad)
				if err != nil {
					errMu.Lock()
					if firstErr == nil {
						firstErr = err
					}
					errMu.Unlock()
					continue
				}
				envs[j.producer][j.seq-1] = b
			}
		}()
	}
	for i := range envs {
		for seq := 1; seq <= len(envs[i]); seq++ {
			jobs <- job{i, seq}
		}
	}
	close(jobs)
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	for i := range envs {
		p.work[i] = wrap(envs[i], cfg.Batch, "envelopes")
		envs[i] = nil
	}
	return p, nil
}

// newOutboxPlan builds the outbox requests: nothing to sign (ingest-api signs), one idempotency key per
// message, unique to the run.
func newOutboxPlan(cfg Config) (*Plan, error) {
	p := &Plan{cfg: cfg, work: make([][]request, cfg.Producers), route: wire.RouteOutbox, outbox: true}
	if cfg.Batch > 0 {
		p.route = wire.RouteOutboxBatch
	}
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("random run id: %w", err)
	}
	run := hex.EncodeToString(b[:])
	pad := strings.Repeat("x", cfg.PayloadBytes)
	p.clients = make([]string, cfg.Producers)
	for i := range p.work {
		pr := cfg.Creds.Producers[i]
		if cfg.SameCredential {
			pr = cfg.Creds.Producers[0]
		}
		if pr.Token == "" || strings.ContainsFunc(pr.Token, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return nil, fmt.Errorf("producer %s: token is empty or holds spaces or control characters", pr.Device)
		}
		p.clients[i] = pr.Token
		n := cfg.Count / cfg.Producers
		if i < cfg.Count%cfg.Producers {
			n++
		}
		bodies := make([][]byte, n)
		for j := range bodies {
			body, err := json.Marshal(map[string]any{
				"project_id": cfg.Project, "topic": cfg.Creds.Topic, "idempotency_key": fmt.Sprintf("k-%s-%d-%d", run, i, j),
				"kind": "loadgen.sample", "payload": map[string]any{"n": j, "pad": pad},
			})
			if err != nil {
				return nil, err
			}
			bodies[j] = body
		}
		p.work[i] = wrap(bodies, cfg.Batch, "messages")
	}
	return p, nil
}

// Project is the project id the plan's streams use.
func (p *Plan) Project() string { return p.cfg.Project }

func signOne(cfg Config, pr Producer, priv ed25519.PrivateKey, seq int, issued time.Time, pad string) ([]byte, error) {
	payload, err := json.Marshal(map[string]any{"n": seq, "pad": pad})
	if err != nil {
		return nil, err
	}
	// Event ids and idempotency keys are scoped by (tenant, project), not by producer, so they carry
	// the device id to stay unique across the run's streams.
	e, err := envelope.Sign(envelope.Draft{
		TenantID: cfg.Creds.Tenant, ProjectID: cfg.Project, ProducerID: pr.Device,
		EventID: fmt.Sprintf("%s-%d", pr.Device, seq), IdempotencyKey: fmt.Sprintf("k-%s-%d", pr.Device, seq),
		KeyID: pr.KeyID, Sequence: int64(seq), IssuedAt: issued,
		Metadata: envelope.Metadata{Kind: "loadgen.sample"}, Payload: payload,
	}, priv)
	if err != nil {
		return nil, fmt.Errorf("producer %s: sign sequence %d: %w", pr.Device, seq, err)
	}
	return e.Canonical(), nil
}

// wrap groups one stream's bodies into requests, in order: one each, or batches under member.
func wrap(envs [][]byte, batch int, member string) []request {
	if batch == 0 {
		reqs := make([]request, len(envs))
		for i, e := range envs {
			reqs[i] = request{body: e, n: 1}
		}
		return reqs
	}
	var reqs []request
	for start := 0; start < len(envs); start += batch {
		end := min(start+batch, len(envs))
		var b bytes.Buffer
		b.WriteString(`{"` + member + `":[`)
		for i := start; i < end; i++ {
			if i > start {
				b.WriteByte(',')
			}
			b.Write(envs[i])
		}
		b.WriteString(`]}`)
		reqs = append(reqs, request{body: b.Bytes(), n: end - start})
	}
	return reqs
}

// Report is what a run measured.
type Report struct {
	Route           string         `json:"route"`
	Producers       int            `json:"producers"`
	Batch           int            `json:"batch"`
	Rate            float64        `json:"rate"`
	Requests        int            `json:"requests"`
	Envelopes       int            `json:"envelopes"` // sent (answered or not)
	Accepted        int            `json:"accepted"`
	Duplicates      int            `json:"duplicates"`
	Refused         map[string]int `json:"refused"`  // by reason, envelopes
	Statuses        map[int]int    `json:"statuses"` // HTTP status of requests
	TransportErrors int            `json:"transport_errors"`
	Elapsed         time.Duration  `json:"elapsed_ns"`
	Throughput      float64        `json:"envelopes_per_second"` // accepted / elapsed
	P50             time.Duration  `json:"p50_ns"`
	P99             time.Duration  `json:"p99_ns"`
	P999            time.Duration  `json:"p999_ns"`
	Max             time.Duration  `json:"max_ns"`
}

// OK reports whether every sent envelope was accepted and none went missing.
func (r Report) OK() bool {
	return r.Envelopes > 0 && r.Accepted == r.Envelopes && r.TransportErrors == 0
}

// String is the one-paragraph human form.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "route %s, producers %d, batch %d: %d envelopes in %d requests in %s\n",
		r.Route, r.Producers, r.Batch, r.Envelopes, r.Requests, r.Elapsed.Round(time.Millisecond))
	fmt.Fprintf(&b, "throughput %.0f envelopes/s accepted; latency per request p50 %s p99 %s p99.9 %s max %s\n",
		r.Throughput, fmtDur(r.P50), fmtDur(r.P99), fmtDur(r.P999), fmtDur(r.Max))
	fmt.Fprintf(&b, "accepted %d, duplicate %d, transport errors %d", r.Accepted, r.Duplicates, r.TransportErrors)
	if len(r.Refused) > 0 {
		keys := make([]string, 0, len(r.Refused))
		for k := range r.Refused {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		b.WriteString(", refused:")
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%d", k, r.Refused[k])
		}
	}
	b.WriteByte('\n')
	return b.String()
}

func fmtDur(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

// answer reads both routes' answers: a single answer, or a batch's results.
type answer struct {
	wire.Answer
	Results []wire.BatchResult `json:"results"`
}

// outboxOutcome reads an outbox answer as an envelope answer: 201 created is accepted, 200 (the same
// request again) a duplicate.
func outboxOutcome(a *wire.Answer, status int) {
	switch status {
	case http.StatusCreated:
		a.Outcome = wire.OutcomeAccepted
	case http.StatusOK:
		a.Outcome = wire.OutcomeDuplicate
	default:
		if a.Outcome != wire.OutcomeRefused {
			a.Outcome, a.Reason = wire.OutcomeRefused, wire.Reason(fmt.Sprintf("http_%d", status))
		}
	}
}

type tally struct {
	requests, envelopes, accepted, duplicates, transport int
	refused                                              map[string]int
	statuses                                             map[int]int
	latencies                                            []time.Duration
	last                                                 time.Time
}

func newTally() *tally { return &tally{refused: map[string]int{}, statuses: map[int]int{}} }

func (t *tally) merge(o *tally) {
	t.requests += o.requests
	t.envelopes += o.envelopes
	t.accepted += o.accepted
	t.duplicates += o.duplicates
	t.transport += o.transport
	for k, v := range o.refused {
		t.refused[k] += v
	}
	for k, v := range o.statuses {
		t.statuses[k] += v
	}
	t.latencies = append(t.latencies, o.latencies...)
	if o.last.After(t.last) {
		t.last = o.last
	}
}

func (t *tally) outcome(a wire.Answer, n int) {
	switch a.Outcome {
	case wire.OutcomeAccepted:
		t.accepted += n
	case wire.OutcomeDuplicate:
		t.duplicates += n
	default:
		r := string(a.Reason)
		if r == "" {
			r = "unknown"
		}
		t.refused[r] += n
	}
}

// record counts one answered request.
func (t *tally) record(status int, body []byte, n int, batch, outbox bool) {
	t.statuses[status]++
	var a answer
	if err := json.Unmarshal(body, &a); err != nil {
		t.refused[fmt.Sprintf("http_%d_unreadable_body", status)] += n
		return
	}
	if outbox {
		if !batch || status != http.StatusOK {
			outboxOutcome(&a.Answer, status)
			t.outcome(a.Answer, n)
			return
		}
		if len(a.Results) != n {
			t.refused["batch_result_count_mismatch"] += n
			return
		}
		for _, r := range a.Results {
			outboxOutcome(&r.Answer, r.Status)
			t.outcome(r.Answer, 1)
		}
		return
	}
	if !batch || status != http.StatusOK {
		if status != http.StatusOK && a.Outcome == wire.OutcomeAccepted {
			// A non-200 that says accepted breaks the contract; never count it as a success.
			a.Outcome, a.Reason = wire.OutcomeRefused, wire.Reason(fmt.Sprintf("http_%d_claims_accepted", status))
		}
		t.outcome(a.Answer, n)
		return
	}
	if len(a.Results) != n {
		t.refused["batch_result_count_mismatch"] += n
		return
	}
	for _, r := range a.Results {
		t.outcome(r.Answer, 1)
	}
}

// Run sends the plan. It returns when every envelope was sent, the duration passed, or ctx ended.
func (p *Plan) Run(ctx context.Context) (Report, error) {
	cfg := p.cfg
	conns := make([]*conn, len(p.work))
	for i := range conns {
		conns[i] = newConn(cfg.URL, p.route, p.clients[i])
		defer conns[i].close()
	}
	producers, err := p.sdkProducers(ctx, conns)
	if err != nil {
		return Report{}, err
	}
	start := cfg.Now()
	runCtx := ctx
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		runCtx, cancel = context.WithDeadline(ctx, start.Add(cfg.Duration))
		defer cancel()
	}
	var (
		slots  atomic.Int64 // envelopes scheduled so far, for rate pacing
		wg     sync.WaitGroup
		tallys = make([]*tally, len(p.work))
	)
	for i := range p.work {
		tallys[i] = newTally()
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			var pr *sdk.Producer
			if producers != nil {
				pr = producers[i]
			}
			p.produce(runCtx, ctx, i, conns[i], pr, start, &slots, tallys[i])
		}(i)
	}
	wg.Wait()
	total := newTally()
	for _, t := range tallys {
		total.merge(t)
	}
	r := Report{
		Route: p.route, Producers: cfg.Producers, Batch: cfg.Batch, Rate: cfg.Rate,
		Requests: total.requests, Envelopes: total.envelopes, Accepted: total.accepted,
		Duplicates: total.duplicates, Refused: total.refused, Statuses: total.statuses,
		TransportErrors: total.transport,
	}
	if !total.last.IsZero() {
		r.Elapsed = total.last.Sub(start)
	}
	if r.Elapsed > 0 {
		r.Throughput = float64(r.Accepted) / r.Elapsed.Seconds()
	}
	sort.Slice(total.latencies, func(a, b int) bool { return total.latencies[a] < total.latencies[b] })
	r.P50 = Percentile(total.latencies, 0.50)
	r.P99 = Percentile(total.latencies, 0.99)
	r.P999 = Percentile(total.latencies, 0.999)
	r.Max = Percentile(total.latencies, 1)
	if err := ctx.Err(); err != nil {
		return r, fmt.Errorf("run interrupted: %w", err)
	}
	return r, nil
}

// produce is one producer: its requests in order, one in flight. runCtx ends issuing (duration);
// ctx is the caller's and also cancels a request in flight.
func (p *Plan) produce(runCtx, ctx context.Context, i int, c *conn, pr *sdk.Producer, start time.Time, slots *atomic.Int64, t *tally) {
	cfg := p.cfg
	var timer *time.Timer
	for _, req := range p.work[i] {
		if runCtx.Err() != nil {
			return
		}
		due := time.Time{}
		if cfg.Rate > 0 {
			k := slots.Add(int64(req.n)) - int64(req.n)
			due = start.Add(time.Duration(float64(k) / cfg.Rate * float64(time.Second)))
			if wait := due.Sub(cfg.Now()); wait > 0 {
				if timer == nil {
					timer = time.NewTimer(wait)
				} else {
					timer.Reset(wait)
				}
				select {
				case <-runCtx.Done():
					timer.Stop()
					return
				case <-timer.C:
				}
			}
		}
		sent := cfg.Now()
		if due.IsZero() || sent.Before(due) {
			due = sent
		}
		rctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
		if pr != nil {
			rs, err := sendSDK(rctx, pr, req)
			cancel()
			done := cfg.Now()
			t.requests++
			t.envelopes += req.n
			t.last = done
			if err != nil {
				t.sdkError(err, req.n)
				continue
			}
			t.latencies = append(t.latencies, done.Sub(due))
			t.results(rs)
			continue
		}
		status, body, err := c.post(rctx, req.body)
		cancel()
		done := cfg.Now()
		t.requests++
		t.envelopes += req.n
		t.last = done
		if err != nil {
			t.transport++
			continue
		}
		t.latencies = append(t.latencies, done.Sub(due))
		t.record(status, body, req.n, cfg.Batch > 0, p.outbox)
	}
}

// Percentile is the nearest-rank percentile of sorted (q in 0..1); zero for no samples.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	// The epsilon keeps q*n that lands on an integer (0.99*100) from rounding up past it.
	rank := int(math.Ceil(q*float64(len(sorted)) - 1e-9))
	if rank < 1 {
		rank = 1
	}
	if rank > len(sorted) {
		rank = len(sorted)
	}
	return sorted[rank-1]
}
