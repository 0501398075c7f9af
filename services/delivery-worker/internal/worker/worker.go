// Package worker owns the delivery loop of the outbox: a tenant scheduler
// that claims due messages from PostgreSQL, hands each to the sender for one
// attempt, and settles the outcome under the claim's fencing token.
//
// # Scheduling
//
// Each cycle asks the store for the tenants with due work (oldest due first)
// and serves them in turn, one claim each, so a tenant with a backlog of
// thousands gets one claim per cycle like everyone else and cannot delay
// another tenant's message by more than one cycle. Before each claim the
// scheduler checks cancellation and takes one token from the tenant's
// delivery limiter (DELIVERY_LIMIT_TOKENS claims per DELIVERY_LIMIT_INTERVAL
// per tenant); a tenant without a token is skipped until a later cycle. The
// limiter only decides whether a claim happens: the 100-row claim bound, the
// retry cap, lease recovery and dead-letter rules are the store's and do not
// change. A limiter error skips the tenant (fail closed).
//
// A claim takes at most as many messages as there are free attempt slots
// (DELIVERY_CONCURRENCY) and never more than store.MaxClaim, so no leased
// message waits in a queue for its request while its lease runs.
//
// # Tenant share
//
// No tenant holds more than TenantMaxInflight of the worker's slots
// (DELIVERY_TENANT_MAX_INFLIGHT, contract §8.7), so a tenant whose endpoint
// hangs until the HTTP timeout ties up its share and no more: the other
// slots keep serving everyone else. The share and the worker's slot count
// an attempt from its claim until the endpoint answers; its settle holds
// neither, and what waits for a settle is bounded on its own (see slots).
// The share bounds the claim itself (a claim asks for at most the tenant's
// free share), so a blocked tenant's
// backlog is never leased by a worker that could not start it; the
// scheduler skips a tenant that holds its share (or nearly: see slots)
// without taking a limiter token, and when every tenant it knows of is so
// it waits for an attempt to end rather than for the poll interval.
//
// # Leases
//
// The worker computes its own lease deadline as the local time just before
// the claim plus DELIVERY_LEASE. The database starts the lease later than
// that, so the local deadline is never after the real one, whatever the
// clock skew between the worker and the database. An attempt runs under a
// context that ends settleMargin before the deadline; after the attempt the
// deadline is checked again and an attempt that has run out of lease is not
// settled (it counts as lease_lost; the message is claimed again when its
// lease expires, with a new attempt number). The store's fence (attempts and
// status) backs this up: a settle for an attempt that no longer owns the
// message is ErrFenced and changes nothing.
//
// Settles are group-committed (see settler): the settlements of attempts
// that finish while a commit is under way go out together in one
// store.SettleBatch, each under its own fence and lease deadline.
//
// # Shutdown
//
// When Run's context ends the scheduler stops claiming; attempts in flight
// get up to Grace to finish and settle; after that their contexts are
// cancelled and they end without settling.
package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/telemetry"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/sender"
)

// ErrConfig reports an unusable Config.
var ErrConfig = errors.New("worker: invalid configuration")

// Config tunes a Worker.
type Config struct {
	Lease       time.Duration // claim lease (DELIVERY_LEASE)
	Concurrency int           // attempts in flight at most
	// TenantMaxInflight bounds one tenant's attempts in flight (0:
	// DefaultTenantMaxInflight; Concurrency turns the bound off).
	TenantMaxInflight int
	// ClaimMax bounds one claim (default and maximum store.MaxClaim).
	ClaimMax int
	// TenantsPerCycle bounds the tenants served per cycle (default 100).
	TenantsPerCycle int
	// PollInterval is the wait when nothing is due or the store failed.
	PollInterval time.Duration
	// TenantRefresh is how long Run may serve the tenants whose last claim
	// came back full before listing due tenants again (default
	// min(PollInterval, 100ms)).
	TenantRefresh time.Duration
	// Grace is how long in-flight attempts may run after Run's context ends.
	Grace time.Duration
	// StoreTimeout bounds each store call.
	StoreTimeout time.Duration
	// StatsInterval is how often the backlog gauges are sampled (0: never).
	StatsInterval time.Duration
	// Now is the clock for lease deadlines and next attempt times (nil:
	// time.Now).
	Now func() time.Time
	// Tracing makes one span per attempt (nil: off, see trace.go).
	Tracing *telemetry.Provider
}

// settleMargin is the part of the lease kept for settling.
func (c Config) settleMargin() time.Duration { return c.Lease / 5 }

// Validate checks the config against the sender's HTTP timeout.
func (c Config) Validate(httpTimeout time.Duration) error {
	switch {
	case c.Lease <= 0 || c.Lease > store.MaxLease:
		return fmt.Errorf("%w: lease must be in (0, %v]", ErrConfig, store.MaxLease)
	case httpTimeout <= 0 || httpTimeout >= c.Lease-c.settleMargin():
		return fmt.Errorf("%w: HTTP timeout must be positive and shorter than 4/5 of the lease", ErrConfig)
	case c.Concurrency < 1:
		return fmt.Errorf("%w: concurrency must be at least 1", ErrConfig)
	case c.TenantMaxInflight < 0 || c.TenantMaxInflight > c.Concurrency:
		return fmt.Errorf("%w: a tenant's attempts in flight must be between 1 and the concurrency", ErrConfig)
	case c.ClaimMax < 0 || c.ClaimMax > store.MaxClaim:
		return fmt.Errorf("%w: claim size must be at most %d", ErrConfig, store.MaxClaim)
	case c.TenantsPerCycle < 0 || c.TenantsPerCycle > store.MaxDueTenants:
		return fmt.Errorf("%w: tenants per cycle must be at most %d", ErrConfig, store.MaxDueTenants)
	case c.PollInterval <= 0:
		return fmt.Errorf("%w: poll interval must be positive", ErrConfig)
	case c.Grace < 0 || c.StoreTimeout <= 0 || c.StatsInterval < 0 || c.TenantRefresh < 0:
		return fmt.Errorf("%w: grace, store timeout and stats interval must not be negative", ErrConfig)
	}
	return nil
}

// Worker claims, attempts and settles outbox messages.
type Worker struct {
	cfg     Config
	outbox  *store.Outbox
	sender  *sender.Sender
	limiter *limiter.Delivery
	log     *slog.Logger
	m       *Metrics
	slots   *slots
	settles settler
	tracer  trace.Tracer
	tracing bool
}

// New builds a Worker. httpTimeout is the sender's, checked against the
// lease.
func New(cfg Config, httpTimeout time.Duration, outbox *store.Outbox, snd *sender.Sender, lim *limiter.Delivery, log *slog.Logger, m *Metrics) (*Worker, error) {
	if cfg.ClaimMax == 0 {
		cfg.ClaimMax = store.MaxClaim
	}
	if cfg.TenantsPerCycle == 0 {
		cfg.TenantsPerCycle = 100
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.TenantMaxInflight == 0 {
		cfg.TenantMaxInflight = DefaultTenantMaxInflight(cfg.Concurrency)
	}
	if cfg.TenantRefresh == 0 {
		cfg.TenantRefresh = min(cfg.PollInterval, 100*time.Millisecond)
	}
	if cfg.Tracing == nil {
		cfg.Tracing = telemetry.Disabled()
	}
	if err := cfg.Validate(httpTimeout); err != nil {
		return nil, err
	}
	return &Worker{cfg: cfg, outbox: outbox, sender: snd, limiter: lim, log: log, m: m,
		slots: newSlots(cfg.Concurrency, cfg.TenantMaxInflight, cfg.ClaimMax), settles: newSettler(),
		tracer: cfg.Tracing.Tracer(TracerName), tracing: cfg.Tracing.Enabled()}, nil
}

// Run delivers until ctx ends, then stops claiming and gives in-flight
// attempts up to Grace. It returns nil after a clean stop; store failures
// are logged and retried, never returned.
func (w *Worker) Run(ctx context.Context) error {
	workCtx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	var inflight sync.WaitGroup
	var stats sync.WaitGroup
	if w.cfg.StatsInterval > 0 {
		stats.Add(1)
		go func() {
			defer stats.Done()
			w.sampleStats(ctx)
		}()
	}

	// The due-tenant list costs a round trip (an index scan of the due
	// tenants, store.DueTenants), so a cycle reuses the previous one's full
	// tenants (their claims came back full: more is due) and asks again
	// only when none is left or the list is TenantRefresh old. A tenant that just got due work waits at most that
	// long plus one cycle.
	var tenants []string
	var listedAt time.Time
	for ctx.Err() == nil {
		var n int
		var err error
		var capped bool
		if len(tenants) == 0 || time.Since(listedAt) >= w.cfg.TenantRefresh {
			tenants, err = w.dueTenants(ctx)
			listedAt = time.Now()
		}
		if err == nil {
			n, tenants, capped, err = w.serve(ctx, workCtx, tenants, &inflight)
		}
		if err != nil && ctx.Err() == nil {
			w.log.Warn("delivery cycle failed", slog.String("error", err.Error()), slog.String("sqlstate", store.SQLState(err)))
		}
		switch {
		case err != nil || (n == 0 && !capped):
			tenants = nil
			w.sleep(ctx, w.cfg.PollInterval)
		case n == 0:
			// Due work only of tenants at their share: it can start when
			// one of them has room again.
			w.slots.waitRoom(ctx, tenants, w.cfg.PollInterval)
		}
	}

	w.log.Info("delivery stopping: no new claims; waiting for in-flight attempts", slog.Duration("grace", w.cfg.Grace))
	done := make(chan struct{})
	go func() {
		inflight.Wait()
		close(done)
	}()
	timer := time.NewTimer(w.cfg.Grace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		w.log.Warn("grace period over: cancelling in-flight attempts; they will not be settled")
		cancelWork()
		<-done
	}
	stats.Wait()
	return nil
}

func (w *Worker) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// Cycle serves every tenant with due work once: for each, check ctx, take a
// limiter token, wait for a free slot, claim and start the attempts (on
// workCtx, tracked by inflight). It returns how many messages it claimed.
func (w *Worker) Cycle(ctx, workCtx context.Context, inflight *sync.WaitGroup) (int, error) {
	tenants, err := w.dueTenants(ctx)
	if err != nil {
		return 0, err
	}
	n, _, _, err := w.serve(ctx, workCtx, tenants, inflight)
	return n, err
}

// serve gives each of tenants one claim (see Cycle). It also returns the
// tenants to serve again before listing anew: those whose claim came back
// full (they most likely have more due work) and those skipped at their
// share (they had due work when listed), and whether any was skipped so.
func (w *Worker) serve(ctx, workCtx context.Context, tenants []string, inflight *sync.WaitGroup) (int, []string, bool, error) {
	total := 0
	var again []string
	capped := false
	for _, tenant := range tenants {
		if ctx.Err() != nil {
			return total, again, capped, nil
		}
		if w.slots.full(tenant) {
			// Before the limiter: a claim that cannot happen takes no token.
			w.m.tenantCapped.Inc()
			again = append(again, tenant)
			capped = true
			continue
		}
		dec, err := w.limiter.Take(ctx, limiter.DeliveryKey{Tenant: tenant})
		if err != nil {
			// Fail closed: no claim without a decision.
			w.log.Warn("delivery limiter failed; tenant skipped this cycle", slog.String("error", err.Error()))
			continue
		}
		if !dec.Allowed {
			w.m.limiterRefused.Inc()
			continue
		}
		n, asked, err := w.claimAndStart(ctx, workCtx, tenant, inflight)
		total += n
		if err != nil {
			return total, again, capped, err
		}
		if n > 0 && n == asked {
			again = append(again, tenant)
		}
	}
	return total, again, capped, nil
}

func (w *Worker) dueTenants(ctx context.Context) ([]string, error) {
	sctx, cancel := context.WithTimeout(ctx, w.cfg.StoreTimeout)
	defer cancel()
	tenants, err := w.outbox.DueTenants(sctx, w.cfg.TenantsPerCycle)
	if err != nil {
		w.m.storeErrors.WithLabelValues("due_tenants").Inc()
		return nil, fmt.Errorf("due tenants: %w", err)
	}
	return tenants, nil
}

// claimAndStart takes the free slots the tenant may use (waiting for at
// least one of the worker's), claims that many messages of tenant and
// starts one attempt per message. It returns how many it claimed and how
// many it asked for.
func (w *Worker) claimAndStart(ctx, workCtx context.Context, tenant string, inflight *sync.WaitGroup) (int, int, error) {
	held := w.slots.take(ctx, tenant, w.cfg.ClaimMax)
	if held == 0 {
		return 0, 0, nil
	}

	// Taken before the claim: the database's lease starts later, so this
	// deadline is never after the real one.
	deadline := w.cfg.Now().Add(w.cfg.Lease)
	// Not cancelled by shutdown: a claim cut off after it committed would
	// leave its messages leased to nobody until the lease expires. What it
	// returns is attempted within the grace period.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), w.cfg.StoreTimeout)
	claimed, err := w.outbox.Claim(sctx, tenant, held, w.cfg.Lease)
	cancel()
	w.m.claims.Inc()
	if err != nil {
		w.slots.release(tenant, held)
		w.m.storeErrors.WithLabelValues("claim").Inc()
		return 0, held, fmt.Errorf("claim: %w", err)
	}
	w.m.claimed.Observe(float64(len(claimed)))
	w.slots.release(tenant, held-len(claimed))
	for i := range claimed {
		c := &claimed[i]
		inflight.Add(1)
		w.m.inFlight.Inc()
		go func() {
			defer func() {
				w.m.inFlight.Dec()
				inflight.Done()
			}()
			w.slots.run(tenant, func(answered func()) { w.attempt(workCtx, c, deadline, answered) })
		}()
	}
	return len(claimed), held, nil
}

// Attempt sends one claimed message and settles the outcome, unless the
// lease deadline has passed or ctx ended first.
func (w *Worker) Attempt(ctx context.Context, c store.Claimed, deadline time.Time) {
	w.attempt(ctx, &c, deadline, func() {})
}

// attempt is Attempt, calling answered as soon as the request has ended,
// before the outcome is settled. It lets go of c.Body then: the settle may
// wait behind a group commit, and a body (up to 1 MiB) held until then
// doubled what a worker's attempts keep in memory.
func (w *Worker) attempt(ctx context.Context, c *store.Claimed, deadline time.Time, answered func()) {
	sendBy := deadline.Add(-w.cfg.settleMargin())
	actx, cancel := context.WithDeadline(ctx, sendBy)
	defer cancel()
	start := time.Now()
	actx, span := w.startAttempt(actx, *c)
	var res sender.Result
	var err error
	switch {
	case len(c.Body) == 0:
		// The body expired while the message was in flight, which only a
		// replay by a release older than migration 0008 (it does not clear
		// the expiry) or a hand edit can cause. A signed empty body would
		// reach the receiver as a valid webhook; retrying cannot bring the
		// body back.
		res = sender.Result{Verdict: sender.Dead, Code: sender.CodePayloadExpired}
		w.log.Warn("message refused: its envelope body has expired; not sent",
			slog.String("message_id", c.MessageID), slog.String("endpoint_id", c.EndpointID))
	case c.SecretRefOwned:
		res, err = w.sender.Send(actx, sender.Message{ID: c.MessageID, URL: c.URL, SecretRef: c.SecretRef, Body: c.Body})
	default:
		// Signing with a ref the tenant does not own would sign its message
		// with another tenant's secret; retrying cannot make the ref its own.
		res = sender.Result{Verdict: sender.Dead, Code: sender.CodeSecretRefForeign}
		w.log.Warn("message refused: its endpoint's secret ref does not belong to its tenant; not sent",
			slog.String("message_id", c.MessageID), slog.String("endpoint_id", c.EndpointID))
	}
	answered()
	c.Body = nil
	w.endAttempt(span, res, err)
	took := time.Since(start)
	elapsed := took.Seconds()
	if err != nil {
		// Shutdown past the grace period, or the attempt ran into the
		// lease margin: the outcome is unknown, the lease will expire.
		result := "aborted"
		if ctx.Err() == nil {
			result = "lease_lost"
			w.m.leaseExpiries.Inc()
		}
		w.m.attempts.WithLabelValues(result, "").Inc()
		w.m.latency.WithLabelValues(result).Observe(elapsed)
		return
	}
	if !w.cfg.Now().Before(deadline) {
		w.m.leaseExpiries.Inc()
		w.m.attempts.WithLabelValues("lease_lost", res.Code).Inc()
		w.m.latency.WithLabelValues("lease_lost").Observe(elapsed)
		w.log.Warn("attempt outlived its lease; not settled", slog.String("message_id", c.MessageID), slog.Int("attempt", c.Attempt))
		return
	}
	w.m.latency.WithLabelValues(res.Verdict.String()).Observe(elapsed)

	verdict := res.Verdict
	st := store.Settlement{MessageID: c.MessageID, Attempt: c.Attempt, Code: res.Code,
		StartedAt: start, Duration: took, HTTPStatus: res.Status}
	switch res.Verdict {
	case sender.Delivered:
		st.Outcome, st.Code = store.SettleDelivered, ""
	case sender.Retry:
		if c.Attempt >= c.MaxAttempts {
			verdict = sender.Dead
		}
		st.Outcome, st.Next = store.SettleRetry, w.cfg.Now().Add(w.sender.NextAttemptDelay(c.Attempt, res))
	case sender.Dead:
		st.Outcome, st.DisableEndpoint = store.SettleDead, res.DisableEndpoint
	default:
		err = fmt.Errorf("worker: unknown verdict %d", res.Verdict)
	}
	if err == nil {
		err = w.settle(ctx, &settleReq{tenant: c.TenantID, st: st, deadline: deadline, done: make(chan settleResult, 1)})
	}
	if errors.Is(err, errLeaseLost) {
		w.m.leaseExpiries.Inc()
		w.m.attempts.WithLabelValues("lease_lost", res.Code).Inc()
		w.log.Warn("attempt outlived its lease while waiting to settle; not settled", slog.String("message_id", c.MessageID), slog.Int("attempt", c.Attempt))
		return
	}
	switch {
	case err == nil:
		w.m.attempts.WithLabelValues(verdict.String(), res.Code).Inc()
		w.logSettled(*c, verdict, res, took)
		if res.DisableEndpoint {
			w.log.Info("endpoint disabled after 410 Gone", slog.String("endpoint_id", c.EndpointID))
		}
	case errors.Is(err, store.ErrFenced):
		w.m.fenced.Inc()
		w.m.attempts.WithLabelValues("fenced", res.Code).Inc()
		w.log.Info("settle fenced: the attempt no longer owns the message", slog.String("message_id", c.MessageID), slog.Int("attempt", c.Attempt))
	default:
		// The message stays delivering; it is claimed again when the lease
		// expires.
		w.m.storeErrors.WithLabelValues("settle").Inc()
		w.m.attempts.WithLabelValues("settle_failed", res.Code).Inc()
		w.log.Warn("settle failed", slog.String("message_id", c.MessageID), slog.Int("attempt", c.Attempt),
			slog.String("error", err.Error()), slog.String("sqlstate", store.SQLState(err)))
	}
}

// logSettled is the one line of a settled attempt (contract §8.8): ids,
// attempt, status (the result, and the HTTP status when an answer came),
// code and duration, the fields of its history row, and nothing else. The
// message and endpoint ids are unique on their own, so the tenant id stays
// out of the worker's logs as everywhere else in them; so does the URL (its
// query may hold a token), and anything of the answer but its status.
func (w *Worker) logSettled(c store.Claimed, verdict sender.Verdict, res sender.Result, took time.Duration) {
	attrs := []slog.Attr{
		slog.String("message_id", c.MessageID),
		slog.String("endpoint_id", c.EndpointID), slog.Int("attempt", c.Attempt),
		slog.String("result", verdict.String()), slog.Int64("duration_ms", took.Milliseconds()),
	}
	if res.Status != 0 {
		attrs = append(attrs, slog.Int("http_status", res.Status))
	}
	if res.Code != "" {
		attrs = append(attrs, slog.String("error_code", res.Code))
	}
	w.log.LogAttrs(context.Background(), slog.LevelInfo, "attempt settled", attrs...)
}

func (w *Worker) sampleStats(ctx context.Context) {
	t := time.NewTicker(w.cfg.StatsInterval)
	defer t.Stop()
	for {
		w.SampleStats(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// SampleStats refreshes the backlog gauges once.
func (w *Worker) SampleStats(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, w.cfg.StoreTimeout)
	defer cancel()
	st, err := w.outbox.OutboxStats(sctx)
	if err != nil {
		if ctx.Err() == nil {
			w.m.storeErrors.WithLabelValues("outbox_stats").Inc()
		}
		return
	}
	w.m.due.Set(float64(st.Due))
	w.m.oldestDueAge.Set(st.OldestDueAge.Seconds())
}
