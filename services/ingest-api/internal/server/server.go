// Package server owns ingest-api's HTTP surface: the echo application that
// authenticates, rate-limits, verifies and commits controlplane/v1 envelopes,
// serves the stream, outbox, dead-letter and outbound-key routes, and answers
// health checks. The routes, their order of checks, codes and bodies are the
// contract's (§2–§4, §7, §8); this comment keeps only the choices the
// contract leaves open.
//
// Client address (§2 step 0, §8.3): the TCP peer's, unless that peer is in
// TRUSTED_PROXIES; then the rightmost X-Forwarded-For entry that is not a
// trusted proxy, a malformed entry stopping the walk at the last trusted hop
// (limiter.TrustedProxies.ClientAddr), so never a value a client wrote.
//
// Bodies (§8.2, body.go): a body starts at 512 bytes and doubles as bytes
// arrive, each growth reserved first from the replica's budget
// (INGEST_MAX_INFLIGHT_BODY_BYTES), which counts capacity actually
// allocated. The budget is part of step 0, before the peer limiter (which
// counts requests, not bytes held): a request refused for it (503, Retry-After
// 1) took no token and is neither authenticated nor audited. The observe
// middleware releases a request's reservation in a defer, whatever ends it.
//
// Batches: steps 0–1c run once per request; the first item's sync token is
// taken before the role check. An Idempotency-Key header is not used on the
// batch route, and every item's answer and audit row carry the request's
// correlation id.
//
// Group commit (committer.go): single posts do steps 0–4 alone, then share
// one store.IngestBatch transaction with whatever queued meanwhile, across
// tenants and streams; a failed transaction answers all of them 503. At most
// GROUP_COMMIT_CONCURRENCY transactions are in flight. Step 3 may use the
// replica's active-key cache (keys.go); the store re-checks the key inside
// the transaction, and a stale entry sends the request back to a fresh
// lookup, so key state changes hold for everything committed after them.
//
// Stream routes: a path parameter that is not an identity is 400
// invalid_request; after and limit that do not parse are 400 invalid_page.
// Reads are peer-limited, not sync-limited, and not audited.
//
// Outbox routes: the outbox limiter sits where the sync limiter does (before
// the role check); a malformed request (store.ValidTopic, metadata.kind,
// max_attempts) is 400 invalid_request; no_signing_key is decided before the
// store, so also for a repeat. An outbound envelope gets event_id "ob-" and
// 32 random hex digits and issued_at in whole milliseconds, and is signed
// once its sequence is allocated, inside its own group commit. Enqueues are
// not audited (the envelope and its messages are the record). Another
// tenant's message id is 404 not_found, like an unknown one; a tenant
// without an outbound key gets an empty key list. An outbound envelope's
// metadata carries "traceparent" when the enqueue had a trace (its span, or
// its valid traceparent header with tracing off; trace.go), so deliveries
// join the trace of what caused them.
//
// Tracing (trace.go): the envelope and outbox POST routes make OpenTelemetry
// spans when tracing is on; an envelope's own metadata.traceparent is the
// parent only once its signature verified.
//
// Refusal details (§8.11): every refusal but a 5xx carries "detail", and so
// does the request's access-log line: a fixed sentence of detail.go, or of
// the envelope module, that never quotes the request, so the sentences are a
// closed list the tests hold every refusal to. openapi.yaml, in the module's
// root, describes the routes and answers; the tests validate real answers
// against it.
//
// Other answers: unknown routes are 404 not_found and wrong methods 405
// method_not_allowed, with the refusal body. X-Correlation-Id is a random
// 128-bit id, also in every log line and audit row of the request; a valid
// traceparent header is logged with it. /healthz never touches the database;
// /readyz answers from a shared probe at most a second old
// (store.Readiness). A failing or slow database is 503 with Retry-After: 1
// on every route. The credential cache (at most 2 s) is the only place a
// revoked credential can still pass.
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

// concerns are the parts of the store the routes use; readiness holds the
// Store itself.
type concerns struct {
	credentials *store.Credentials
	inbound     *store.Inbound
	outbox      *store.Outbox
}

// Server is the ingest API. Build it with New, serve Handler, and Close it
// after the HTTP server has shut down.
type Server struct {
	cfg     Config
	store   concerns
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
		cfg: cfg, store: concerns{st.Credentials(), st.Inbound(), st.Outbox()}, log: log,
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
	s.commit = newCommitter(st.Inbound(), log, s.metrics, cfg.StoreTimeout, cfg.GroupCommitWindow, cfg.GroupCommitMaxItems, cfg.GroupCommitConcurrency)
	s.outboxCommit = newOutboxCommitter(st.Outbox(), log, s.metrics, cfg.StoreTimeout, cfg.GroupCommitWindow, cfg.GroupCommitMaxItems, cfg.GroupCommitConcurrency)
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

	// The fixed paths are the wire package's, which clients post to; those
	// with a parameter are its path helpers' patterns.
	e.POST(wire.RouteEnvelopes, s.traced(s.postEnvelope))
	e.POST(wire.RouteBatch, s.traced(s.postBatch))
	v1 := e.Group("/v1")
	v1.GET("/streams/:project/:producer", s.getStream)
	v1.GET("/streams/:project/:producer/envelopes", s.getStreamEnvelopes)
	e.POST(wire.RouteOutbox, s.traced(s.postOutbox))
	e.POST(wire.RouteOutboxBatch, s.traced(s.postOutboxBatch))
	v1.GET("/outbox/:id", s.getOutboxMessage) // wire.OutboxMessagePath
	v1.GET("/outbox/:id/attempts", s.getOutboxAttempts)
	e.GET(wire.RouteDeadLetters, s.getDeadLetters)
	v1.POST("/dead-letters/:id/replay", s.replayDeadLetter) // wire.ReplayPath
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
	detail := ""
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			reason, status, detail = reasonNotFound, http.StatusNotFound, detailNoRoute
		case http.StatusMethodNotAllowed:
			reason, status, detail = reasonMethodNotAllowed, http.StatusMethodNotAllowed, detailNoMethod
		case http.StatusRequestEntityTooLarge:
			reason, status = reasonBodyTooLarge, http.StatusRequestEntityTooLarge
			detail = envelope.BodyTooLargeDetail(int(s.cfg.MaxBodyBytes))
		}
	}
	s.writeRefusal(c, status, reason, detail)
}
