package server

import (
	"errors"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
)

// DefaultMaxInflightBodyBytes is the default bound on request-body bytes held
// at once (INGEST_MAX_INFLIGHT_BODY_BYTES, contract §8.2).
const DefaultMaxInflightBodyBytes = 64 << 20

// firstBodyChunk is what a request holds before its first byte has come: a
// connection that declares a body and sends nothing costs this much, however
// large the Content-Length it declared.
const firstBodyChunk = 512

// bodyBudget bounds the bytes of request bodies held at once, across every
// route that reads one. It counts the capacity of the buffers actually
// allocated, grown as bytes arrive, never a declared length: an idle sender
// holds firstBodyChunk, and one that trickles holds at most twice what it
// sent, so exhausting the budget costs an attacker the bytes themselves.
type bodyBudget struct {
	max  int64
	held atomic.Int64
}

// reserve takes n bytes of the budget, or none of them.
func (b *bodyBudget) reserve(n int64) bool {
	for {
		cur := b.held.Load()
		if cur+n > b.max {
			return false
		}
		if b.held.CompareAndSwap(cur, cur+n) {
			return true
		}
	}
}

func (b *bodyBudget) release(n int64) {
	if n != 0 {
		b.held.Add(-n)
	}
}

// readBody enforces the body limit (step 0): a declared Content-Length over
// the limit is refused unread, and the reader is capped so a chunked body
// stops at limit+1 bytes. The buffer grows only as bytes arrive, each growth
// reserved from the in-flight budget first; past the budget the request is
// answered 503 unavailable (Retry-After: 1). What it reserves stays held by
// the request until observe releases it after the handler, whatever path the
// handler took. ok is false when the request has been answered. A body that
// cannot be read (a broken chunked stream, a client gone) is answered
// malformed, the route's reason for a bad body.
func (s *Server) readBody(c echo.Context, malformed wire.Reason) ([]byte, bool) {
	r := c.Request()
	limit := s.cfg.MaxBodyBytes
	if r.ContentLength > limit {
		s.refuseTooLarge(c)
		return nil, false
	}
	// One byte past the limit (or past the declared length) lets the reader
	// see the end without another growth; a declared length only caps the
	// growth, it never sizes a buffer.
	ceiling := limit + 1
	if r.ContentLength >= 0 {
		ceiling = min(ceiling, r.ContentLength+1)
	}
	st := state(c)
	src := http.MaxBytesReader(c.Response(), r.Body, limit)
	var buf []byte
	for {
		if len(buf) == cap(buf) {
			grown := min(max(2*int64(cap(buf)), firstBodyChunk), ceiling)
			if grown <= int64(cap(buf)) {
				// The readers below end a body before ceiling bytes; should
				// one ever not, refuse rather than read into no room forever.
				s.refuseTooLarge(c)
				return nil, false
			}
			if !s.bodies.reserve(grown - int64(cap(buf))) {
				s.metrics.bodyBudgetRefusals.Inc()
				s.refuse(c, reasonUnavailable, "")
				return nil, false
			}
			st.bodyHeld += grown - int64(cap(buf))
			next := make([]byte, len(buf), grown)
			copy(next, buf)
			buf = next
		}
		n, err := src.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, true
		}
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				s.refuseTooLarge(c)
				return nil, false
			}
			s.refuse(c, malformed, detailUnreadableBody)
			return nil, false
		}
	}
}
