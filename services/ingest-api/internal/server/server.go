// Package server owns ingest-api's HTTP surface: the echo application that
// authenticates, rate-limits, verifies and commits controlplane/v1 envelopes
// (contract §2), serves the stream read routes, and answers health checks.
//
// # Order of a POST /v1/envelopes
//
// Contract §2, step by step, each step stopping the request:
//
//	0  Content-Length over the body limit: 413 body_too_large, without
//	   reading; then the body is read through http.MaxBytesReader, so a
//	   chunked body is cut at the limit (413 too), into a buffer that grows
//	   as bytes arrive against the in-flight body budget (503 unavailable +
//	   Retry-After: 1 past it; see below). Then the peer limiter,
//	   keyed by the client address, an IPv4 address or an IPv6 /64 (429
//	   rate_limited + Retry-After). The client address is the TCP peer's
//	   unless that peer is inside TRUSTED_PROXIES: then it is the rightmost
//	   X-Forwarded-For entry that is not itself a trusted proxy (header
//	   lines concatenated in order; a malformed entry stops the walk at the
//	   last trusted hop, whose address is used: never a value a client
//	   wrote; see limiter.TrustedProxies.ClientAddr). From any other peer
//	   the header is ignored. With TRUSTED_PROXIES empty (the default)
//	   every client behind a proxy shares the proxy's bucket.
//	1  the bearer credential is verified by the store (401 unauthenticated,
//	   never audited; a failing database is 503, never 401).
//	1b the sync limiter, keyed by tenant/account/device/"sync-ingest" (429).
//	1c only role device may post (403 forbidden, audited).
//	2  structure and identities (400 invalid_envelope), tenant and producer
//	   must be the credential's (403 route_mismatch), and then the
//	   Idempotency-Key header, when present, must equal the envelope's key
//	   (400 idempotency_key_mismatch).
//	3  the key in the verified tenant, and the signature (403 unknown_key,
//	   key_retired, key_revoked, bad_signature).
//	4  schema version, metadata and issued_at window (400 ...).
//	5-6 the store, under the stream lock, in one transaction with the audit
//	   row, through the group committer; 7 only then the answer.
//
// Every answer from 1c on writes exactly one audit row, in the same
// transaction as the envelope for accepts, and is only sent once that row is
// committed. The peer limiter counts only /v1/ routes; health routes are
// never limited and /metrics lives on its own listener.
//
// # Memory under hostile load
//
// Contract §8.2. A declared Content-Length is never an allocation: readBody
// (body.go) starts every body at 512 bytes and doubles the buffer as bytes
// arrive, capped at the declared length or the limit (plus one byte to see
// the end). Every growth is first reserved from one budget per replica,
// MaxInflightBodyBytes (INGEST_MAX_INFLIGHT_BODY_BYTES, default 64 MiB),
// which counts buffer capacity actually allocated; a request that cannot
// reserve its next growth is answered 503 unavailable with Retry-After: 1
// (counted in envelopeworker_ingest_inflight_body_refusals_total). An idle
// connection thus holds 512 bytes of it and a trickling one at most twice
// what it sent. A request keeps its reservation until its handler returns
// (the decided envelope and the group commit still reference the body); the
// observe middleware gives it back in a defer, so an answer, an error, a
// panic and a client gone mid-body all release it. The bytes held are the
// gauge envelopeworker_ingest_inflight_body_bytes.
//
// The budget sits inside step 0, while the body is read, before the peer
// limiter: the contract orders the body limit first, and the peer limiter
// counts requests, not bytes or how long they stay, so it cannot bound what
// connections hold; the budget bounds it for every peer at once. A request
// refused for the budget has taken no peer or sync token and is not
// authenticated or audited; its 503 says nothing was acknowledged, so the
// client retries. Routes without a body never touch the budget.
//
// # Batches
//
// POST /v1/envelopes/batch runs steps 0–1c once for the request, taking one
// sync-limiter token for the first item before the role check; a refusal of
// that first token is a whole-request 429 and nothing is processed. A
// non-device credential is a whole-request 403 forbidden (one audit row), and
// a malformed wrapper a whole-request 400 invalid_envelope (one audit row).
// Every further item takes its own token; once one is refused, it and every
// later item answer rate_limited (status 429, not audited) and the earlier
// items are processed. All processed items commit in one transaction, so the
// answer is either all durable or a 503. An Idempotency-Key header is not
// used on the batch route: each envelope carries its own key. Every item's
// answer, and its audit row, carries the request's correlation id.
//
// # Group commit
//
// Single posts do steps 0–4 on their own and then queue their BatchItem (an
// ingest, or the audit row of a refusal) with the committer, which commits
// whatever concurrent requests queued meanwhile — across tenants and streams
// — in one store.IngestBatch transaction and answers each request from its
// own result. A failed transaction answers all of its requests 503. At most
// GROUP_COMMIT_CONCURRENCY (default 2) transactions are in flight: fewer
// flushes make larger groups, and a set-based batch costs PostgreSQL a fixed
// few statements per transaction plus a little per envelope.
//
// Step 3 of a single post may take an active key from the replica's cache
// (keys.go) instead of the database; the envelope then carries the public key
// it was verified with, and the store decides it only if that key is still
// active with that public key inside the ingest transaction. A stale answer
// drops the entry and the request runs steps 2–6 again from a fresh lookup,
// so retirement, revocation and prune take effect for every envelope
// committed after them. The batch route looks its keys up per request.
//
// # Stream routes
//
// GET /v1/streams/{project}/{producer} is for role device and its own
// producer only; GET /v1/streams/{project}/{producer}/envelopes is for role
// service. Both take the tenant from the credential. Path parameters that
// are not valid identities are 400 invalid_request; "limit" (1–100, default
// 100) and "after" (a non-negative integer, default 0) that do not parse or
// fall outside their range are 400 invalid_page. Reads are peer-limited but
// not sync-limited and not audited. A page of envelopes holds at most limit
// envelopes and at most envelope.MaxPageBytes (4 MiB) of stored envelope
// JSON, but always the first envelope due, however large; its cursor is
// still the stream's, and a reader continues with after = the last sequence
// it got until that equals the cursor. The store stops at the byte budget,
// and the page is written from its rows without being encoded again.
//
// # Outbox routes
//
// POST /v1/outbox (role service) runs the body limit (413), the peer
// limiter, authentication, the outbox limiter (contract §8.4: one token per
// message request, keyed by tenant/account/device/"outbox-enqueue", 429
// rate_limited + Retry-After, not audited), the role check (403
// forbidden), then reads the
// body as strictly as an envelope: unknown, duplicate, missing or malformed
// members, an identity-rule violation in project_id or idempotency_key, a
// topic outside ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$, a kind that is not a
// valid metadata.kind, a max_attempts that is not an exact integer in 1–50
// (default 12), and a request whose envelope would break the envelope
// limits, are 400 invalid_request. A tenant without an outbound key is 422
// no_signing_key (checked before the store, so also for a repeat). The store
// then answers the repeat (200, the stored envelope byte for byte), 422
// idempotency_conflict or 422 no_endpoint, or enqueues (201) the envelope
// signed here: producer_id is the credential's device, event_id "ob-" and
// 32 random hex digits, issued_at the server clock in whole milliseconds,
// metadata {"kind"} plus "traceparent" when the request had a trace (the
// enqueue's span, or its valid traceparent header with tracing off; see
// trace.go), so that deliveries join the trace of what caused them. "Same request content" is SHA-256 of the JCS of the
// body. The outbox limiter sits where the sync limiter sits on the envelope
// routes (step 1b, before the role check), so a refused request costs no
// parsing and no database work, and a credential of the wrong role is
// limited like any other; it is a limiter of its own (OUTBOX_LIMIT_TOKENS
// per OUTBOX_LIMIT_INTERVAL, by default the SYNC_LIMIT_* values), so
// enqueues never spend sync-ingest tokens or the reverse. Enqueues go
// through their own group commit (outboxCommit, contract §8.6): concurrent
// requests of any stream share one store.EnqueueBatch transaction, a
// stream's new envelopes take consecutive sequences in arrival order, and
// each is signed once its sequence is allocated, inside that transaction.
// POST /v1/outbox/batch (contract §8.5) takes {"messages":[…]} of 1–100
// bodies (a malformed wrapper, or a count outside that, is the whole
// request's 400 invalid_request; the body limit is the request's), one
// outbox-limiter token per message (the first refused: the whole request's
// 429; a later one: that and every following item rate_limited), and
// answers 200 {"results":[…]}: each item's POST /v1/outbox answer plus
// "status", as if sent one by one, all committed in one transaction or the
// whole request is 503. Enqueues are not audited:
// the outbound envelope, its sequence and its messages are the record;
// replays are audited (outcome replayed, by the store, in the replay's
// transaction).
//
// GET /v1/outbox/{message_id} (service or operator), GET /v1/dead-letters
// (operator; project_id required and an identity, else 400
// invalid_request; limit 1–100 and the opaque after cursor, else 400
// invalid_page) and POST /v1/dead-letters/{message_id}/replay (operator; 409
// not_dead) take the tenant from the credential: another tenant's message id
// is 404 not_found, like an unknown one. Unset status fields are null.
// GET /v1/outbox/{message_id}/attempts (service or operator, contract §8.8)
// answers as GET /v1/outbox/{message_id} does for unknown and foreign ids,
// and otherwise the latest 100 attempts, oldest first (an empty list for a
// message never attempted).
//
// GET /v1/outbound-keys (service or operator; contract §8.10) lists the
// credential's tenant's outbound public keys, current first, then the
// earlier ones the keys file lists (outboundkeys.PublicKeys); a tenant
// without a key answers 200 with an empty list, a failing key source 503.
// It takes no parameters, so another tenant's keys cannot be named.
//
// # Other answers
//
// Unknown routes answer 404 not_found and wrong methods 405
// method_not_allowed, with the refusal body. Every answer carries
// X-Correlation-Id, a random 128-bit id made per request, which is also in
// every log line of the request and in its audit rows; a valid W3C
// traceparent header (version 00) is logged with it, an invalid one is
// ignored. The envelope and outbox POST routes also make OpenTelemetry
// spans when tracing is on (trace.go). /healthz is liveness only (it never touches the database);
// /readyz checks that the database answers and that its schema is at or
// above migrations.Latest(), the version this build needs (contract §8.1: a
// later release's migration never makes this one unready), from a shared
// probe at most one second old (store.Readiness). Any database failure or
// timeout answers 503 unavailable (with Retry-After: 1) on every route. The
// credential cache (CredentialCacheTTL, at most 2 s) is the only place a
// revoked credential can still pass, and only for that long.
package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/limiter"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/telemetry"
	"github.com/envelopeworker/envelopeworker/services/ingest-api/internal/outboundkeys"
)

// Config is what the server needs beyond the store. Zero values of the
// optional fields take the documented defaults.
type Config struct {
	PayloadRetention time.Duration // default 2160h
	ReplayWindow     time.Duration // default 2160h
	MaxSequenceAhead int64         // default 1024
	SyncLimit        limiter.Policy
	PeerLimit        limiter.Policy
	// OutboxLimit defaults to SyncLimit (contract §8.4).
	OutboxLimit limiter.Policy
	// TrustedProxies may name the client in X-Forwarded-For; zero: nobody.
	TrustedProxies limiter.TrustedProxies
	// MaxBodyBytes may only tighten the contract's 1 MiB.
	MaxBodyBytes int64
	// MaxInflightBodyBytes bounds the request-body bytes held at once
	// (default DefaultMaxInflightBodyBytes); it must exceed MaxBodyBytes,
	// so that a body of the largest size fits when nothing else is held.
	MaxInflightBodyBytes int64
	StoreTimeout         time.Duration // default 10s
	CredentialCacheTTL   time.Duration // 0: no cache; at most 2s
	GroupCommitWindow    time.Duration
	// GroupCommitMaxItems defaults to 100; 1 turns grouping off.
	GroupCommitMaxItems int
	// GroupCommitConcurrency defaults to 8: transactions in flight, of
	// which one is being decided and the rest wait for their WAL flush
	// (see committer). Deciding one group at a time is what lets groups form.
	GroupCommitConcurrency int
	// Now is the clock for issued_at checks, payload expiry, the
	// issued_at of outbound envelopes and the age of readiness probes;
	// tests fix it.
	Now func() time.Time
	// OutboundKeys signs outbox envelopes; nil means no tenant has a key
	// (every POST /v1/outbox is 422 no_signing_key).
	OutboundKeys outboundkeys.Source
	// Tracing makes the spans of trace.go; nil: off.
	Tracing *telemetry.Provider
}

// ErrConfig reports an unusable Config.
var ErrConfig = errors.New("server: invalid config")

func (c *Config) setDefaults() error {
	if c.PayloadRetention == 0 {
		c.PayloadRetention = 2160 * time.Hour
	}
	if c.ReplayWindow == 0 {
		c.ReplayWindow = 2160 * time.Hour
	}
	if c.MaxSequenceAhead == 0 {
		c.MaxSequenceAhead = 1024
	}
	if limit := int64(envelope.DefaultLimits().MaxBytes); c.MaxBodyBytes <= 0 || c.MaxBodyBytes > limit {
		c.MaxBodyBytes = limit
	}
	if c.MaxInflightBodyBytes == 0 {
		c.MaxInflightBodyBytes = DefaultMaxInflightBodyBytes
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = 10 * time.Second
	}
	if c.GroupCommitMaxItems == 0 {
		c.GroupCommitMaxItems = 100
	}
	if c.GroupCommitConcurrency == 0 {
		c.GroupCommitConcurrency = 8
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.OutboundKeys == nil {
		c.OutboundKeys = outboundkeys.None{}
	}
	if c.Tracing == nil {
		c.Tracing = telemetry.Disabled()
	}
	if c.OutboxLimit == (limiter.Policy{}) {
		c.OutboxLimit = c.SyncLimit
	}
	switch {
	case c.PayloadRetention < 0, c.ReplayWindow < 0, c.StoreTimeout < 0, c.GroupCommitWindow < 0:
		return fmt.Errorf("%w: negative duration", ErrConfig)
	case c.MaxSequenceAhead < 1:
		return fmt.Errorf("%w: MaxSequenceAhead must be at least 1", ErrConfig)
	case c.CredentialCacheTTL < 0 || c.CredentialCacheTTL > 2*time.Second:
		return fmt.Errorf("%w: CredentialCacheTTL must be within 0..2s", ErrConfig)
	case c.MaxInflightBodyBytes <= c.MaxBodyBytes:
		return fmt.Errorf("%w: MaxInflightBodyBytes must exceed MaxBodyBytes", ErrConfig)
	case c.GroupCommitMaxItems < 1 || c.GroupCommitConcurrency < 1:
		return fmt.Errorf("%w: group commit sizes must be positive", ErrConfig)
	}
	return nil
}

// Server is the ingest API. Build it with New, serve Handler, and Close it
// after the HTTP server has shut down.
type Server struct {
	cfg     Config
	store   *store.Store
	log     *slog.Logger
	metrics *metrics
	peer    *limiter.Peer
	sync    *limiter.Sync
	outbox  *limiter.Sync
	creds   *credentialCache
	bodies  *bodyBudget
	// activeKeys lets the single route skip the key lookup (see keys.go).
	activeKeys *activeKeys
	commit     *committer[store.BatchItem, store.Result]
	// outboxCommit is the group commit of POST /v1/outbox (contract §8.6).
	outboxCommit *committer[store.EnqueueItem, store.EnqueueAnswer]
	keys         outboundkeys.Source
	ready        *store.Readiness
	echo         *echo.Echo
	tracer       trace.Tracer
}

// New builds the server over st. Metrics register on reg (use a private
// registry: NewRegistry).
func New(cfg Config, st *store.Store, log *slog.Logger, reg prometheus.Registerer) (*Server, error) {
	if st == nil || log == nil || reg == nil {
		return nil, fmt.Errorf("%w: store, logger and registerer are required", ErrConfig)
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	peer, err := limiter.New[limiter.PeerKey](cfg.PeerLimit)
	if err != nil {
		return nil, fmt.Errorf("server: peer limiter: %w", err)
	}
	syncL, err := limiter.New[limiter.SyncKey](cfg.SyncLimit)
	if err != nil {
		_ = peer.Close(context.Background())
		return nil, fmt.Errorf("server: sync limiter: %w", err)
	}
	bodies := &bodyBudget{max: cfg.MaxInflightBodyBytes}
	outboxL, err := limiter.New[limiter.SyncKey](cfg.OutboxLimit)
	if err != nil {
		_ = peer.Close(context.Background())
		_ = syncL.Close(context.Background())
		return nil, fmt.Errorf("server: outbox limiter: %w", err)
	}
	s := &Server{
		cfg: cfg, store: st, log: log,
		metrics:    newMetrics(reg, bodies),
		bodies:     bodies,
		peer:       peer,
		sync:       syncL,
		outbox:     outboxL,
		creds:      newCredentialCache(cfg.CredentialCacheTTL, time.Now),
		activeKeys: newActiveKeys(time.Now),
		keys:       cfg.OutboundKeys,
		tracer:     cfg.Tracing.Tracer(TracerName),
		ready:      store.NewReadiness(st, store.ReadinessConfig{Need: migrations.Latest(), Timeout: cfg.StoreTimeout, Now: cfg.Now}),
	}
	s.commit = newCommitter(st, log, s.metrics, cfg.StoreTimeout, cfg.GroupCommitWindow, cfg.GroupCommitMaxItems, cfg.GroupCommitConcurrency)
	s.outboxCommit = newOutboxCommitter(st, log, s.metrics, cfg.StoreTimeout, cfg.GroupCommitWindow, cfg.GroupCommitMaxItems, cfg.GroupCommitConcurrency)
	s.echo = s.routes()
	return s, nil
}

// Handler is the API's http.Handler.
func (s *Server) Handler() http.Handler { return s.echo }

// Close commits what the group committer still holds and releases the
// limiters. Call it after http.Server.Shutdown returned, before closing the
// store.
func (s *Server) Close(ctx context.Context) error {
	s.commit.close()
	s.outboxCommit.close()
	return errors.Join(s.peer.Close(ctx), s.sync.Close(ctx), s.outbox.Close(ctx))
}

func (s *Server) routes() *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	// The peer limiter must see the connection's address, or what a trusted
	// proxy says it was, never a header a client can forge.
	e.IPExtractor = s.clientIP
	e.HTTPErrorHandler = s.handleError
	e.Use(s.observe, s.recoverPanic)

	e.GET("/healthz", s.healthz)
	e.GET("/readyz", s.readyz)

	// The producer routes' paths are the wire package's, which producers post to.
	e.POST(wire.RouteEnvelopes, s.traced(s.postEnvelope))
	e.POST(wire.RouteBatch, s.traced(s.postBatch))
	v1 := e.Group("/v1")
	v1.GET("/streams/:project/:producer", s.getStream)
	v1.GET("/streams/:project/:producer/envelopes", s.getStreamEnvelopes)
	v1.POST("/outbox", s.traced(s.postOutbox))
	v1.POST("/outbox/batch", s.traced(s.postOutboxBatch))
	v1.GET("/outbox/:id", s.getOutboxMessage)
	v1.GET("/outbox/:id/attempts", s.getOutboxAttempts)
	v1.GET("/dead-letters", s.getDeadLetters)
	v1.POST("/dead-letters/:id/replay", s.replayDeadLetter)
	v1.GET("/outbound-keys", s.getOutboundKeys)
	return e
}

// clientIP is the request's client address (see TrustedProxies.ClientAddr),
// "" when the peer has none (a Unix socket).
func (s *Server) clientIP(r *http.Request) string {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return ""
	}
	a := s.cfg.TrustedProxies.ClientAddr(peer.Addr(), r.Header.Values(echo.HeaderXForwardedFor))
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// recoverPanic turns a handler panic into a 500 without printing the panic
// value, which could hold request data.
func (s *Server) recoverPanic(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) (err error) {
		defer func() {
			if r := recover(); r != nil {
				if r == http.ErrAbortHandler {
					panic(r)
				}
				s.logger(c).Error("handler panic", slog.String("type", fmt.Sprintf("%T", r)))
				err = errPanic
			}
		}()
		return next(c)
	}
}

var errPanic = errors.New("handler panic")

// handleError answers errors that no handler answered: echo's routing
// errors and panics.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var he *echo.HTTPError
	reason := reasonUnavailable
	status := http.StatusInternalServerError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			reason, status = reasonNotFound, http.StatusNotFound
		case http.StatusMethodNotAllowed:
			reason, status = reasonMethodNotAllowed, http.StatusMethodNotAllowed
		case http.StatusRequestEntityTooLarge:
			reason, status = reasonBodyTooLarge, http.StatusRequestEntityTooLarge
		}
	}
	s.writeRefusal(c, status, reason)
}
