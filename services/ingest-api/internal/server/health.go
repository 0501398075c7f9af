package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/migrations"
)

type healthBody struct {
	Status string `json:"status"`
}

// healthz is liveness: the process answers. It does not touch the database,
// so an outage does not make an orchestrator restart healthy replicas.
func (s *Server) healthz(c echo.Context) error {
	state(c).outcome = "ok"
	writeJSON(c, http.StatusOK, healthBody{Status: "ok"})
	return nil
}

// errSchemaMismatch is a database whose migrations are not the ones this
// build expects.
var errSchemaMismatch = errors.New("schema version mismatch")

// readyz is readiness: the database answers and its schema is exactly the
// migrations this build embeds.
func (s *Server) readyz(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), s.cfg.StoreTimeout)
	defer cancel()
	if err := s.store.Ping(ctx); err != nil {
		return s.unavailable(c, "ping", err)
	}
	v, err := s.store.SchemaVersion(ctx)
	if err != nil {
		return s.unavailable(c, "schema_version", err)
	}
	if want := migrations.Latest(); v != want {
		return s.unavailable(c, "schema_version", fmt.Errorf("%w: database at %d, build expects %d", errSchemaMismatch, v, want))
	}
	state(c).outcome = "ok"
	writeJSON(c, http.StatusOK, healthBody{Status: "ready"})
	return nil
}
