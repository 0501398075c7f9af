package sender

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/netguard"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/signer"
)

// Verdict is what the outbox does with an attempt.
type Verdict int

const (
	// Delivered: a 2xx answer.
	Delivered Verdict = iota + 1
	// Retry: try again after the backoff, unless max_attempts is reached.
	Retry
	// Dead: no further attempt.
	Dead
)

func (v Verdict) String() string {
	switch v {
	case Delivered:
		return "delivered"
	case Retry:
		return "retry"
	case Dead:
		return "dead"
	}
	return "unknown"
}

// Stable error codes. These are the only values a dead letter, a log line
// or a metric label carries about a failed attempt.
const (
	CodeHTTP4xx         = "http_4xx"
	CodeHTTP410         = "http_410"
	CodeHTTP429         = "http_429"
	CodeHTTP5xx         = "http_5xx"
	CodeTimeout         = "timeout"
	CodeConnectFailed   = "connect_failed"
	CodeRedirectRefused = "redirect_refused"
	CodeBlockedAddress  = "blocked_address"
	CodeTLSFailed       = "tls_failed"
	CodeNoSecret        = "no_secret"
	// CodeSecretRefForeign: the worker refused to sign with a secret ref
	// the message's tenant does not own (never sent).
	CodeSecretRefForeign = "secret_ref_foreign"
	// CodePayloadExpired: the message's envelope body is gone (never sent).
	CodePayloadExpired = "payload_expired"
)

// Result classifies one attempt.
type Result struct {
	Verdict Verdict
	// Code is the stable error code ("" when delivered).
	Code string
	// DisableEndpoint is set for 410 Gone.
	DisableEndpoint bool
	// RetryAfter is the server's Retry-After on 429 (0: none or
	// unparsable), before capping.
	RetryAfter time.Duration
	// Status is the HTTP status (0 when no answer came).
	Status int
}

// Classify maps an attempt's response or error to the contract's verdict.
// resp's body is not read. now resolves an HTTP-date Retry-After.
func Classify(resp *http.Response, err error, now time.Time) Result {
	if err != nil {
		return classifyErr(err)
	}
	s := resp.StatusCode
	r := Result{Status: s}
	switch {
	case s >= 200 && s <= 299:
		r.Verdict = Delivered
	case s >= 300 && s <= 399:
		// CheckRedirect returned ErrUseLastResponse: never followed.
		r.Verdict, r.Code = Dead, CodeRedirectRefused
	case s == http.StatusRequestTimeout:
		// Retried, but recorded as the contract's generic http_4xx: only 410
		// and 429 have codes of their own.
		r.Verdict, r.Code = Retry, CodeHTTP4xx
	case s == http.StatusTooManyRequests:
		r.Verdict, r.Code = Retry, CodeHTTP429
		r.RetryAfter = ParseRetryAfter(resp.Header.Get("Retry-After"), now)
	case s == http.StatusGone:
		r.Verdict, r.Code, r.DisableEndpoint = Dead, CodeHTTP410, true
	case s >= 500 && s <= 599:
		r.Verdict, r.Code = Retry, CodeHTTP5xx
	default:
		// Other 4xx, and statuses outside 2xx–5xx (a 1xx final answer, 6xx+):
		// the receiver refuses this message; repeating it will not help.
		r.Verdict, r.Code = Dead, CodeHTTP4xx
	}
	return r
}

func classifyErr(err error) Result {
	var (
		certErr    *tls.CertificateVerificationError
		hostErr    x509.HostnameError
		authErr    x509.UnknownAuthorityError
		invalidErr x509.CertificateInvalidError
		alertErr   tls.AlertError
		recordErr  tls.RecordHeaderError
		netErr     net.Error
		echErr     *tls.ECHRejectionError
	)
	switch {
	case errors.Is(err, netguard.ErrBlocked), errors.Is(err, errInsecureURL):
		return Result{Verdict: Dead, Code: CodeBlockedAddress}
	case errors.Is(err, signer.ErrNoSecret):
		return Result{Verdict: Retry, Code: CodeNoSecret}
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &netErr) && netErr.Timeout():
		return Result{Verdict: Retry, Code: CodeTimeout}
	case errors.As(err, &certErr), errors.As(err, &hostErr), errors.As(err, &authErr),
		errors.As(err, &invalidErr), errors.As(err, &alertErr), errors.As(err, &recordErr),
		errors.As(err, &echErr):
		return Result{Verdict: Retry, Code: CodeTLSFailed}
	default:
		return Result{Verdict: Retry, Code: CodeConnectFailed}
	}
}

// ParseRetryAfter reads delay-seconds or an HTTP-date (RFC 9110 §10.2.3).
// Anything else, or a date in the past, is 0.
func ParseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseUint(v, 10, 63); err == nil {
		// Clamp before converting: a huge value must not overflow into a
		// negative duration.
		const maxSecs = uint64(1<<63-1) / uint64(time.Second)
		return time.Duration(min(n, maxSecs)) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// Backoff is the contract's retry schedule.
type Backoff struct {
	Base, Cap time.Duration
	// Jitter is the largest fraction taken off a delay, in [0, 1): the delay
	// of attempt n lies in [(1-Jitter)·d, d], d = min(Cap, Base·2^(n−1)), so
	// jitter spreads a thundering herd without ever exceeding the cap.
	Jitter float64
	// Rand returns a float in [0, 1); nil uses math/rand/v2.
	Rand func() float64
}

// Delay is the wait after failed attempt n (1-based), honouring retryAfter
// (the server's Retry-After) up to the cap: the wait is never shorter than
// the server asked for, unless that exceeds the cap.
func (b Backoff) Delay(attempt int, retryAfter time.Duration) time.Duration {
	d := b.Base
	for i := 1; i < attempt && d < b.Cap; i++ {
		d *= 2
	}
	d = min(d, b.Cap)
	if b.Jitter > 0 {
		r := b.Rand
		if r == nil {
			r = rand.Float64
		}
		// Jitter is added, so a retry never comes before the contract's
		// min(cap, base·2^(attempt−1)); only at the cap, where adding would
		// pass it, is it taken off instead.
		j := time.Duration(float64(d) * b.Jitter * r())
		if d+j <= b.Cap {
			d += j
		} else {
			d -= j
		}
	}
	if retryAfter > 0 {
		d = max(d, min(retryAfter, b.Cap))
	}
	return d
}

// RetryableHTTPBackoff adapts Delay to go-retryablehttp's Backoff hook
// (attemptNum counts from 0 there). The Retry-After of a 429 is read
// from resp.
func (b Backoff) RetryableHTTPBackoff(_, _ time.Duration, attemptNum int, resp *http.Response) time.Duration {
	var ra time.Duration
	if resp != nil && resp.StatusCode == http.StatusTooManyRequests {
		ra = ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())
	}
	return b.Delay(attemptNum+1, ra)
}
