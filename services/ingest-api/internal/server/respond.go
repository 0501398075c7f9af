package server

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// writeJSON writes v with status. Marshal errors cannot happen for the
// fixed types written here; if one did, the client gets a bare 500.
//
// HTML escaping is off: it would rewrite <, >, & and U+2028/9 inside stored
// envelopes (json.RawMessage), which must go out byte for byte as signed.
// Answers are application/json, never HTML.
func writeJSON(c echo.Context, status int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		_ = c.NoContent(http.StatusInternalServerError)
		return
	}
	_ = c.Blob(status, echo.MIMEApplicationJSON, bytes.TrimSuffix(b.Bytes(), []byte("\n")))
}

// writeAnswer writes an envelope answer with the status its reason maps to.
func (s *Server) writeAnswer(c echo.Context, a answer) {
	st := state(c)
	a.CorrelationID = st.correlationID
	st.outcome, st.reason, st.detail = string(a.Outcome), string(a.Reason), a.Detail
	s.metrics.envelopes.WithLabelValues(string(a.Outcome), string(a.Reason)).Inc()
	writeJSON(c, a.Reason.Status(), a)
}

// writeRefusal answers a refusal with the contract's refusal body and, but
// for a 5xx, its detail (contract §8.11), which the access log repeats.
func (s *Server) writeRefusal(c echo.Context, status int, reason wire.Reason, detail string) {
	st := state(c)
	if status >= http.StatusInternalServerError {
		detail = ""
	}
	st.outcome, st.reason, st.detail = string(outcomeRefused), string(reason), detail
	if status == http.StatusServiceUnavailable {
		c.Response().Header().Set(wire.HeaderRetryAfter, "1")
	}
	writeJSON(c, status, answer{Outcome: outcomeRefused, Reason: reason, CorrelationID: st.correlationID, Detail: detail})
}

// refuse answers reason with its contract status and detail, one of the
// fixed sentences of detail.go or of the envelope module.
func (s *Server) refuse(c echo.Context, reason wire.Reason, detail string) error {
	s.writeRefusal(c, reason.Status(), reason, detail)
	return nil
}

// refuseTooLarge answers 413 naming the body limit in force.
func (s *Server) refuseTooLarge(c echo.Context) error {
	return s.refuse(c, reasonBodyTooLarge, envelope.BodyTooLargeDetail(int(s.cfg.MaxBodyBytes)))
}

// rateLimited answers 429 with Retry-After in whole seconds.
func (s *Server) rateLimited(c echo.Context, policy string, retryAfterSeconds int64) error {
	s.metrics.limiterRefused.WithLabelValues(policy).Inc()
	c.Response().Header().Set(wire.HeaderRetryAfter, strconv.FormatInt(retryAfterSeconds, 10))
	return s.refuse(c, reasonRateLimited, limiterDetail[policy])
}

// unavailable answers 503 for a failing dependency. The error is logged
// (store errors carry no driver or SQL detail, and never request secrets)
// but never sent.
func (s *Server) unavailable(c echo.Context, op string, err error) error {
	s.metrics.storeErrors.WithLabelValues(op).Inc()
	attrs := []any{slog.String("operation", op), slog.String("error", err.Error())}
	if code := store.SQLState(err); code != "" {
		attrs = append(attrs, slog.String("sql_state", code))
	}
	s.logger(c).Error("dependency failed", attrs...)
	return s.refuse(c, reasonUnavailable, "")
}
