package server

import (
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

const stateKey = "envelopeworker.request"

// reqState is what one request carries from middleware to handler and back
// to the access log. Nothing secret is ever put here: no credential,
// signature, payload or idempotency key.
type reqState struct {
	correlationID string
	traceparent   string // only when valid
	route         string
	start         time.Time

	identity *store.Identity

	// outcome and reason of the HTTP answer, for the access log and metrics;
	// detail, a refusal's fixed sentence, for the access log only (it would
	// multiply metric series).
	outcome, reason, detail string
	// items counts batch items by outcome for the access log.
	items int
	// bodyHeld is what readBody reserved from the in-flight body budget;
	// observe gives it back once the handler is done with the body.
	bodyHeld int64
	// trace is the request's spans in the making; nil unless the route is
	// traced and tracing is on (trace.go).
	trace *reqTrace
}

func state(c echo.Context) *reqState {
	st, _ := c.Get(stateKey).(*reqState)
	if st == nil {
		// Only reachable if a route bypassed the middleware; give it a
		// correlation id rather than panic.
		st = &reqState{correlationID: newCorrelationID(), start: time.Now()}
		c.Set(stateKey, st)
	}
	return st
}

// newCorrelationID is 128 random bits in hex: unguessable, so it cannot be
// used to probe another request's audit trail.
func newCorrelationID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// validTraceparent accepts W3C Trace Context version 00 exactly:
// 00-<32 lowercase hex, not all zero>-<16 lowercase hex, not all zero>-<2 hex>.
// Anything else is ignored, never echoed into logs.
func validTraceparent(s string) bool {
	if len(s) != 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' || s[:2] != "00" {
		return false
	}
	hexOK := func(p string) bool {
		nonZero := false
		for i := 0; i < len(p); i++ {
			ch := p[i]
			switch {
			case ch >= '0' && ch <= '9':
				if ch != '0' {
					nonZero = true
				}
			case ch >= 'a' && ch <= 'f':
				nonZero = true
			default:
				return false
			}
		}
		return nonZero
	}
	flags := s[53:]
	return hexOK(s[3:35]) && hexOK(s[36:52]) && (hexOK(flags) || flags == "00")
}

// routeLabel is the matched route template (e.g. /v1/streams/:project/:producer);
// unmatched requests share one label so a client cannot mint metric series
// with made-up paths.
func routeLabel(c echo.Context) string {
	p := c.Path()
	if p == "" || strings.HasSuffix(p, "/*") {
		return "unmatched"
	}
	return p
}

// observe is the outermost middleware: it makes the correlation id, reads
// the traceparent, and after the handler writes one access-log line and the
// request metrics.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		st := &reqState{correlationID: newCorrelationID(), start: time.Now()}
		if tp := c.Request().Header.Get("Traceparent"); validTraceparent(tp) {
			st.traceparent = tp
		}
		st.route = routeLabel(c)
		c.Set(stateKey, st)
		// Deferred, so a body's reservation is given back on every path:
		// an answer, an error, a panic, a client gone.
		defer func() { s.bodies.release(st.bodyHeld) }()
		c.Response().Header().Set(wire.HeaderCorrelationID, st.correlationID)

		err := next(c)
		if err != nil {
			// Handlers answer every case themselves; an error here comes
			// from echo (404/405) or a bug. Let the error handler write it
			// now so status and outcome below are the real ones.
			c.Error(err)
		}

		status := c.Response().Status
		dur := time.Since(st.start)
		s.metrics.duration.WithLabelValues(st.route).Observe(dur.Seconds())
		s.metrics.requests.WithLabelValues(st.route, st.outcome, st.reason).Inc()

		attrs := []slog.Attr{
			slog.String("correlation_id", st.correlationID),
			slog.String("method", c.Request().Method),
			slog.String("route", st.route),
			slog.Int("status", status),
			slog.String("outcome", st.outcome),
			slog.Float64("duration_ms", float64(dur.Microseconds())/1000),
		}
		if st.reason != "" {
			attrs = append(attrs, slog.String("reason", st.reason))
		}
		if st.detail != "" {
			attrs = append(attrs, slog.String("detail", st.detail))
		}
		if st.traceparent != "" {
			attrs = append(attrs, slog.String("traceparent", st.traceparent))
		}
		if st.identity != nil {
			attrs = append(attrs,
				slog.String("tenant_id", st.identity.TenantID),
				slog.String("device_id", st.identity.DeviceID),
				slog.String("credential_id", st.identity.CredentialID))
		}
		if st.items > 0 {
			attrs = append(attrs, slog.Int("items", st.items))
		}
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelError
		}
		s.log.LogAttrs(c.Request().Context(), level, "request", attrs...)
		return nil
	}
}

// logger returns the server logger carrying the request's correlation id and
// trace context, for lines written inside a handler.
func (s *Server) logger(c echo.Context) *slog.Logger {
	st := state(c)
	l := s.log.With(slog.String("correlation_id", st.correlationID))
	if st.traceparent != "" {
		l = l.With(slog.String("traceparent", st.traceparent))
	}
	return l
}
