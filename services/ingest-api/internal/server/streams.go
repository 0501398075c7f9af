package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

const (
	defaultPageLimit = 100
	maxPageLimit     = 100
)

// validIdentity is the contract's identity rule for path parameters:
// ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$.
func validIdentity(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		alnum := ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9'
		if !alnum && (i == 0 || ch != '.' && ch != '_' && ch != '-') {
			return false
		}
	}
	return true
}

type streamState struct {
	Cursor      int64 `json:"cursor"`
	ReplayFloor int64 `json:"replay_floor"`
}

// getStream serves a device its own stream's cursor and replay floor.
func (s *Server) getStream(c echo.Context) error {
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	project, producer := c.Param("project"), c.Param("producer")
	if id.Role != store.RoleDevice || producer != id.DeviceID {
		return s.refuse(c, reasonForbidden)
	}
	if !validIdentity(project) {
		return s.refuse(c, reasonInvalidRequest)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	ss, err := s.store.Stream(ctx, id.TenantID, project, producer)
	if err != nil {
		return s.unavailable(c, "stream", err)
	}
	st := state(c)
	st.outcome = "read"
	writeJSON(c, http.StatusOK, streamState{Cursor: ss.Cursor, ReplayFloor: ss.ReplayFloor})
	return nil
}

type streamEnvelope struct {
	Sequence       int64           `json:"sequence"`
	EventIdentity  string          `json:"event_identity"`
	Envelope       json.RawMessage `json:"envelope"`
	PayloadExpired bool            `json:"payload_expired"`
}

type streamPage struct {
	Envelopes []streamEnvelope `json:"envelopes"`
	Cursor    int64            `json:"cursor"`
}

var jsonNull = json.RawMessage("null")

// getStreamEnvelopes serves a service credential the retained envelopes of
// a stream in its own tenant, in sequence order, up to the cursor.
func (s *Server) getStreamEnvelopes(c echo.Context) error {
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	if id.Role != store.RoleService {
		return s.refuse(c, reasonForbidden)
	}
	project, producer := c.Param("project"), c.Param("producer")
	if !validIdentity(project) || !validIdentity(producer) {
		return s.refuse(c, reasonInvalidRequest)
	}
	after, limit, ok := pageParams(c)
	if !ok {
		return s.refuse(c, reasonInvalidPage)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	rows, cursor, err := s.store.ReadStream(ctx, id.TenantID, project, producer, after, limit)
	if err != nil {
		return s.unavailable(c, "read_stream", err)
	}
	page := streamPage{Envelopes: make([]streamEnvelope, 0, len(rows)), Cursor: cursor}
	for _, r := range rows {
		e := streamEnvelope{Sequence: r.Sequence, EventIdentity: r.EventIdentity, PayloadExpired: r.PayloadExpired}
		if r.PayloadExpired || r.Envelope == nil {
			e.Envelope, e.PayloadExpired = jsonNull, true
		} else {
			// The stored canonical form, byte for byte: it is what was
			// verified, and consumers may re-verify it.
			e.Envelope = json.RawMessage(r.Envelope)
		}
		page.Envelopes = append(page.Envelopes, e)
	}
	state(c).outcome = "read"
	writeJSON(c, http.StatusOK, page)
	return nil
}

// pageParams parses after (default 0, a non-negative integer) and limit
// (default 100, 1–100). A value that does not parse is as wrong as one out
// of range: both are invalid_page.
func pageParams(c echo.Context) (after int64, limit int, ok bool) {
	q := c.QueryParams()
	limit = defaultPageLimit
	if vs, present := q["limit"]; present {
		if len(vs) != 1 {
			return 0, 0, false
		}
		n, err := strconv.Atoi(vs[0])
		if err != nil || n < 1 || n > maxPageLimit {
			return 0, 0, false
		}
		limit = n
	}
	if vs, present := q["after"]; present {
		if len(vs) != 1 {
			return 0, 0, false
		}
		n, err := strconv.ParseInt(vs[0], 10, 64)
		if err != nil || n < 0 {
			return 0, 0, false
		}
		after = n
	}
	return after, limit, true
}
