package sender

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
)

// Attempts in flight together to one endpoint leave their connections idle
// for the next ones, up to IdleConnsPerHost: a second wave of as many
// attempts dials nothing new. (With the transport's old fixed 8, each wave of
// 20 would have redialled 12.)
func TestConcurrentAttemptsReuseConnections(t *testing.T) {
	const wave = 20
	var dials atomic.Int32
	var arrived sync.WaitGroup
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Hold every request until the whole wave is in: wave connections
		// are open at once.
		arrived.Done()
		arrived.Wait()
		w.WriteHeader(http.StatusNoContent)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dials.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	s := newSender(t, Config{AllowLoopback: true, IdleConnsPerHost: wave})

	for round := range 2 {
		arrived.Add(wave)
		var wg sync.WaitGroup
		codes := make([]string, wave)
		for i := range wave {
			wg.Go(func() {
				r, err := s.Send(context.Background(), Message{ID: "msg-1", URL: srv.URL + "/hook", SecretRef: "ep", Body: []byte(`{"a":1}`)})
				if err != nil {
					codes[i] = err.Error()
					return
				}
				codes[i] = r.Verdict.String()
			})
		}
		wg.Wait()
		for i, c := range codes {
			if c != Delivered.String() {
				t.Fatalf("round %d attempt %d: %s", round, i, c)
			}
		}
	}
	if n := dials.Load(); n != wave {
		t.Fatalf("%d connections dialled for two waves of %d, want %d (the second reuses the first's)", n, wave, wave)
	}
}
