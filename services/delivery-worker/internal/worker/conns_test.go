package worker

import (
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// One tenant's endpoint answering 5xx must not make the worker dial every
// other tenant's endpoint again: go-retryablehttp closed the whole pool after
// each failed attempt until the sender stopped it (internal/sender,
// keepIdle). 200 messages to each tenant, one attempt each, interleaved by the
// tenant scheduler.
func TestFailingTenantKeepsOtherTenantsConnections(t *testing.T) {
	const (
		messages    = 200
		concurrency = 8
	)
	e := newEnv(t)
	serve := func(status int) (*httptest.Server, *atomic.Int32) {
		var opened atomic.Int32
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(status) }))
		srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				opened.Add(1)
			}
		}
		srv.Start()
		t.Cleanup(srv.Close)
		return srv, &opened
	}
	failing, _ := serve(http.StatusBadGateway)
	healthy, healthyConns := serve(http.StatusNoContent)
	for i, tenant := range []string{"tfail", "tok"} {
		srv := []*httptest.Server{failing, healthy}[i]
		e.endpoint(tenant, "orders", srv.URL+"/hook", testRefs[i]) // a ref belongs to one tenant
		_, seed := e.enqueue(tenant, "orders", 1)                  // one attempt: a 5xx is dead at once
		e.exec(`INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity,
		            max_attempts, budget, next_attempt_at)
		        SELECT tenant_id, 'msg_' || lpad(to_hex(g), 24, '0'), project_id, topic, endpoint_id, event_identity,
		            max_attempts, budget, next_attempt_at
		        FROM outbox_messages, generate_series(1, $2::int - 1) g WHERE tenant_id = $1 AND message_id = $3`, tenant, messages, seed[0])
	}
	w, m := newWorker(t, e.dsn, opts{concurrency: concurrency, claimMax: concurrency})
	open := func() int {
		return e.count(`SELECT count(*) FROM outbox_messages WHERE status NOT IN ('delivered', 'dead')`)
	}
	cycleUntil(t, w, func() bool { return open() == 0 })

	if d, f := attempts(m, "delivered", ""), attempts(m, "dead", "http_5xx"); d != messages || f != messages {
		t.Fatalf("%d delivered, %d dead with http_5xx; want %d each", d, f, messages)
	}
	t.Logf("the healthy endpoint accepted %d connections for %d deliveries", healthyConns.Load(), messages)
	// At most concurrency attempts run at once; a dial racing a connection's
	// return to the pool may add one more each (see the sender's test).
	if n := healthyConns.Load(); n > 2*concurrency {
		t.Fatalf("the healthy endpoint accepted %d connections for %d deliveries at concurrency %d, want at most %d",
			n, messages, concurrency, 2*concurrency)
	}
}
