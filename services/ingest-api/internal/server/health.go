package server

import (
	"errors"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

type healthBody struct {
	Status string `json:"status"`
}

// healthz is liveness: the process answers. It does not touch the database,
// so an outage does not make an orchestrator restart healthy replicas.
func (s *Server) healthz(c echo.Context) error {
	state(c).outcome = outcomeOK
	writeJSON(c, http.StatusOK, healthBody{Status: "ok"})
	return nil
}

// readyz is readiness: the database answers and its schema is at or above
// the version this build needs (contract §8.1). It is on the public port and
// never limited, so it answers from a shared probe at most a second old
// (store.Readiness) rather than costing the database a query per call.
func (s *Server) readyz(c echo.Context) error {
	if err := s.ready.Check(c.Request().Context()); err != nil {
		op := "readiness"
		if errors.Is(err, store.ErrSchemaBehind) {
			op = "schema_version"
		}
		return s.unavailable(c, op, err)
	}
	state(c).outcome = outcomeOK
	writeJSON(c, http.StatusOK, healthBody{Status: "ready"})
	return nil
}
