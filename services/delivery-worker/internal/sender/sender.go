// Package sender owns one delivery attempt: one HTTP POST of the stored
// envelope bytes to the endpoint, signed per Standard Webhooks, and the
// contract's classification of what came back (Classify) and of when to try
// again (Backoff).
//
// It uses github.com/hashicorp/go-retryablehttp with RetryMax 0: one claimed
// attempt is exactly one request, because durable retries belong to the
// outbox (a retry must survive a crash and be fenced by the attempt
// counter). The client's CheckRetry and Backoff hooks hold the contract's
// classification so the library and the worker cannot disagree.
//
// Safety rules:
//   - redirects are never followed (CheckRedirect returns
//     http.ErrUseLastResponse; the 3xx is dead with redirect_refused);
//   - every connection's resolved address passes netguard at connect time;
//   - no proxy from the environment is used (it would bypass netguard);
//   - plain http only to loopback under AllowLoopback; other http URLs are
//     dead with blocked_address without a connection attempt;
//   - the response body is never read beyond a bounded drain, never kept;
//   - the client has no logger: URLs may carry tokens in their query;
//   - one endpoint's failure never closes another endpoint's pooled
//     connections (see keepIdle).
//
// A message whose secret ref has no secret is not sent and is classified
// Retry with code no_secret: a missing secret is usually a deploy that has
// not yet shipped the new secrets file, which the watcher picks up without a
// restart; if it never arrives the message ends dead with no_secret after
// max_attempts. TLS failures are retried (tls_failed) like connection errors,
// since certificate renewals and handshake glitches are often transient.
package sender

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/hashicorp/go-retryablehttp"

	"github.com/envelopeworker/envelopeworker/modules/telemetry"

	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/netguard"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/signer"
)

// ErrAborted reports an attempt cut short by its context (shutdown or the
// lease deadline): its outcome is unknown and must not be settled.
var ErrAborted = errors.New("sender: attempt aborted")

var errInsecureURL = errors.New("sender: endpoint URL refused")

// drainLimit bounds how much of a response body is read to reuse the
// connection.
const drainLimit = 64 << 10

// Config configures a Sender.
type Config struct {
	// Timeout bounds the whole request (connect, TLS, headers, body); it must
	// be shorter than the lease.
	Timeout       time.Duration
	AllowLoopback bool
	Backoff       Backoff
	// Resolver, if set, replaces the system resolver (tests).
	Resolver *net.Resolver
	// TLSConfig, if set, is cloned for the transport (tests add a root CA).
	TLSConfig *tls.Config
	// Secrets resolves a secret ref at each attempt.
	Secrets func(ref string) []secrets.Secret
	// Now is the clock for webhook-timestamp (nil: time.Now).
	Now func() time.Time
	// UserAgent is sent on every request.
	UserAgent string
	// IdleConnsPerHost is how many idle connections to one endpoint are kept
	// for reuse (default 8). Set it to the worker's concurrency: with fewer,
	// a backlog for one endpoint closes and redials a connection for most
	// attempts instead of reusing it.
	IdleConnsPerHost int
}

// Sender performs attempts. It is safe for concurrent use.
type Sender struct {
	cfg       Config
	policy    netguard.Policy
	client    *retryablehttp.Client
	transport *http.Transport
}

// keepIdle is the client's RoundTripper without the transport's
// CloseIdleConnections. go-retryablehttp's Client.Do calls
// HTTPClient.CloseIdleConnections on every attempt it counts as failed (a
// 5xx, a timeout, a refused connection: whatever CheckRetry would retry),
// which closes the idle connections to every endpoint in the shared pool, so
// one tenant's failing endpoint made every other tenant's next attempt dial
// and handshake again. The failing connection needs no such help: net/http
// already discards a connection whose request timed out or broke, or whose
// body is closed before its end (Send drains at most drainLimit). Sender.Close
// reaches the transport directly.
type keepIdle struct{ http.RoundTripper }

// Message is what an attempt needs of a claimed outbox message.
type Message struct {
	ID, URL, SecretRef string
	Body               []byte
}

// New builds a Sender.
func New(cfg Config) *Sender {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.UserAgent == "" {
		cfg.UserAgent = "envelopeworker-delivery/1"
	}
	if cfg.IdleConnsPerHost < 1 {
		cfg.IdleConnsPerHost = 8
	}
	policy := netguard.Policy{AllowLoopback: cfg.AllowLoopback}
	dialer := policy.Dialer(cfg.Timeout, cfg.Resolver)
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.TLSConfig != nil {
		tlsCfg = cfg.TLSConfig.Clone()
		if tlsCfg.MinVersion < tls.VersionTLS12 {
			tlsCfg.MinVersion = tls.VersionTLS12
		}
	}
	transport := &http.Transport{
		Proxy:                 nil,
		DialContext:           dialer.DialContext,
		TLSClientConfig:       tlsCfg,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   cfg.Timeout,
		ResponseHeaderTimeout: cfg.Timeout,
		MaxIdleConns:          max(256, cfg.IdleConnsPerHost),
		MaxIdleConnsPerHost:   cfg.IdleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
	}
	// No Client.Timeout: Send bounds each attempt with a context deadline
	// instead, because with a Timeout and a RoundTripper that is not
	// *http.Transport (keepIdle), net/http starts a timer goroutine per request.
	hc := &http.Client{
		Transport: keepIdle{transport},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	s := &Sender{cfg: cfg, policy: policy, transport: transport}
	s.client = &retryablehttp.Client{
		HTTPClient:   hc,
		Logger:       nil,
		RetryWaitMin: cfg.Backoff.Base,
		RetryWaitMax: cfg.Backoff.Cap,
		RetryMax:     0,
		CheckRetry:   s.checkRetry,
		Backoff:      cfg.Backoff.RetryableHTTPBackoff,
		ErrorHandler: retryablehttp.PassthroughErrorHandler,
	}
	return s
}

// checkRetry is the client's CheckRetry hook: the contract's classification.
// With RetryMax 0 it decides nothing about a second request; it keeps the
// library's view identical to the verdict the worker settles.
func (s *Sender) checkRetry(ctx context.Context, resp *http.Response, err error) (bool, error) {
	if ctx.Err() != nil {
		return false, ctx.Err()
	}
	return Classify(resp, err, s.cfg.Now()).Verdict == Retry, nil
}

// Close drops idle connections (at shutdown: the client's own
// CloseIdleConnections does nothing, see keepIdle).
func (s *Sender) Close() { s.transport.CloseIdleConnections() }

// Send performs one attempt. The error is non-nil only when ctx ended first
// (ErrAborted): every other outcome, including refusals before any request,
// is a Result.
func (s *Sender) Send(ctx context.Context, m Message) (Result, error) {
	u, err := url.Parse(m.URL)
	if err != nil {
		return Result{Verdict: Dead, Code: CodeBlockedAddress}, nil
	}
	switch {
	case u.Scheme == "https" && u.Host != "":
	case u.Scheme == "http" && s.cfg.AllowLoopback && isLoopbackHost(u.Hostname()):
		ctx = netguard.WithPlainHTTP(ctx)
	default:
		return classifyErr(errInsecureURL), nil
	}
	if u.User != nil {
		// net/http would turn user info into an Authorization header; the
		// endpoint rules refuse it, so a row that has it is not trusted.
		return classifyErr(errInsecureURL), nil
	}
	secs := s.cfg.Secrets(m.SecretRef)
	if len(secs) == 0 {
		return classifyErr(signer.ErrNoSecret), nil
	}
	// The attempt's own deadline: when it passes, the attempt is a timeout;
	// when ctx ends first, it is aborted (checked on parent below).
	parent := ctx
	if s.cfg.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.Timeout)
		defer cancel()
	}
	req, err := retryablehttp.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(m.Body))
	if err != nil {
		return classifyErr(errInsecureURL), nil
	}
	// No rewindable body: with one and the Idempotency-Key header, net/http's Transport replays the
	// POST by itself when a reused connection fails after the receiver read the request, so one
	// attempt could be two requests. retryablehttp reads the body through its own reader, not GetBody.
	req.GetBody = nil
	if err := signer.SetHeaders(req.Header, m.ID, s.cfg.Now(), m.Body, secs); err != nil {
		return classifyErr(err), nil
	}
	req.Header.Set("User-Agent", s.cfg.UserAgent)
	// The attempt's trace context (see worker.startAttempt); none when the
	// envelope has no traceparent and tracing is off.
	telemetry.Inject(ctx, req.Header)

	resp, err := s.client.Do(req)
	if resp != nil {
		defer func() {
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, drainLimit))
			_ = resp.Body.Close()
		}()
	}
	if parent.Err() != nil {
		return Result{}, errors.Join(ErrAborted, parent.Err())
	}
	return Classify(resp, err, s.cfg.Now()), nil
}

// NextAttemptDelay is the backoff after failed attempt n for r.
func (s *Sender) NextAttemptDelay(attempt int, r Result) time.Duration {
	return s.cfg.Backoff.Delay(attempt, r.RetryAfter)
}

func isLoopbackHost(h string) bool {
	if strings.EqualFold(h, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && netguard.IsLoopback(a)
}
