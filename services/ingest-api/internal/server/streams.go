package server

import (
	"context"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

const (
	defaultPageLimit = 100
	maxPageLimit     = 100
)

// getStream serves a device its own stream's cursor and replay floor.
func (s *Server) getStream(c echo.Context) error {
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	project, producer := c.Param("project"), c.Param("producer")
	if id.Role != store.RoleDevice || producer != id.DeviceID {
		return s.refuse(c, reasonForbidden, detailOwnStream)
	}
	if !envelope.ValidIdentity(project) {
		return s.refuse(c, reasonInvalidRequest, detailPathProject)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	ss, err := s.store.inbound.Stream(ctx, id.TenantID, project, producer)
	if err != nil {
		return s.unavailable(c, "stream", err)
	}
	st := state(c)
	st.outcome = outcomeRead
	writeJSON(c, http.StatusOK, wire.StreamState{Cursor: ss.Cursor, ReplayFloor: ss.ReplayFloor})
	return nil
}

// getStreamEnvelopes serves a service credential the retained envelopes of
// a stream in its own tenant, in sequence order, up to the cursor: at most
// limit of them and at most envelope.MaxPageBytes of envelope JSON, but
// always the first one due (contract §8.2). The store stops at the budget,
// so a page of large envelopes is held once, as the store's rows, and
// written from them.
func (s *Server) getStreamEnvelopes(c echo.Context) error {
	id, ok := s.admit(c)
	if !ok {
		return nil
	}
	if id.Role != store.RoleService {
		return s.refuse(c, reasonForbidden, detailRoleService)
	}
	project, producer := c.Param("project"), c.Param("producer")
	if !envelope.ValidIdentity(project) {
		return s.refuse(c, reasonInvalidRequest, detailPathProject)
	}
	if !envelope.ValidIdentity(producer) {
		return s.refuse(c, reasonInvalidRequest, detailPathProducer)
	}
	after, limit, detail := pageParams(c)
	if detail != "" {
		return s.refuse(c, reasonInvalidPage, detail)
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	rows, cursor, err := s.store.inbound.ReadStream(ctx, id.TenantID, project, producer, after, limit, envelope.MaxPageBytes)
	if err != nil {
		return s.unavailable(c, "read_stream", err)
	}
	state(c).outcome = outcomeRead
	writeStreamPage(c.Response(), rows, cursor)
	return nil
}

// writeStreamPage writes a wire.StreamPage,
//
//	{"envelopes":[{"sequence":S,"event_identity":"…","envelope":{…}|null,"payload_expired":B},…],"cursor":C}
//
// straight from the store's rows, each stored envelope byte for byte (the
// canonical form that was verified, which consumers may re-verify), with no
// encoder building and then copying the page. Sequence and cursor are
// integers and event identities lowercase hex, so nothing here needs
// escaping. A write error means the client left; there is no one to tell.
func writeStreamPage(w *echo.Response, rows []store.StreamEnvelope, cursor int64) {
	w.Header().Set(echo.HeaderContentType, echo.MIMEApplicationJSON)
	w.WriteHeader(http.StatusOK)
	out := make([]byte, 0, 512)
	out = append(out, `{"envelopes":[`...)
	for i, r := range rows {
		if i > 0 {
			out = append(out, ',')
		}
		out = append(out, `{"sequence":`...)
		out = strconv.AppendInt(out, r.Sequence, 10)
		out = append(out, `,"event_identity":"`...)
		out = append(out, r.EventIdentity...)
		out = append(out, `","envelope":`...)
		expired := r.PayloadExpired || r.Envelope == nil
		if expired {
			out = append(out, "null"...)
		} else {
			_, _ = w.Write(out)
			_, _ = w.Write(r.Envelope)
			out = out[:0]
		}
		out = append(out, `,"payload_expired":`...)
		out = strconv.AppendBool(out, expired)
		out = append(out, '}')
	}
	out = append(out, `],"cursor":`...)
	out = strconv.AppendInt(out, cursor, 10)
	out = append(out, '}')
	_, _ = w.Write(out)
}

// pageParams parses after (default 0, a non-negative integer) and limit
// (default 100, 1–100). A value that does not parse is as wrong as one out
// of range: both are invalid_page, whose detail names the parameter ("" when
// both are fine).
func pageParams(c echo.Context) (after int64, limit int, detail string) {
	q := c.QueryParams()
	limit = defaultPageLimit
	if vs, present := q["limit"]; present {
		if len(vs) != 1 {
			return 0, 0, detailPageLimit
		}
		n, err := strconv.Atoi(vs[0])
		if err != nil || n < 1 || n > maxPageLimit {
			return 0, 0, detailPageLimit
		}
		limit = n
	}
	if vs, present := q["after"]; present {
		if len(vs) != 1 {
			return 0, 0, detailPageAfter
		}
		n, err := strconv.ParseInt(vs[0], 10, 64)
		if err != nil || n < 0 {
			return 0, 0, detailPageAfter
		}
		after = n
	}
	return after, limit, ""
}
