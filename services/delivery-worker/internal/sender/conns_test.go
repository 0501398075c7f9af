package sender

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// connCounts are the connections a countingServer accepted and saw closed.
type connCounts struct{ opened, closed atomic.Int32 }

// countingServer starts a server (TLS when tlsOn) that counts its
// connections.
func countingServer(t *testing.T, tlsOn bool, h http.HandlerFunc) (*httptest.Server, *connCounts) {
	t.Helper()
	conns := &connCounts{}
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			conns.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			conns.closed.Add(1)
		}
	}
	if tlsOn {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return srv, conns
}

// Failed attempts leave the pool alone, but shutdown still empties it.
func TestCloseClosesIdleConnections(t *testing.T) {
	srv, conns := countingServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	s := newSender(t, Config{AllowLoopback: true})
	if r := send(t, s, srv.URL+"/hook"); r.Verdict != Delivered {
		t.Fatalf("%+v", r)
	}
	s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for conns.closed.Load() < conns.opened.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d connections still open after Close", conns.opened.Load()-conns.closed.Load(), conns.opened.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Attempts in flight together to one endpoint leave their connections idle
// for the next ones, up to IdleConnsPerHost: a second wave of as many
// attempts dials nothing new. (With the transport's old fixed 8, each wave of
// 20 would have redialled 12.)
func TestConcurrentAttemptsReuseConnections(t *testing.T) {
	const wave = 20
	var arrived sync.WaitGroup
	srv, dials := countingServer(t, false, func(w http.ResponseWriter, r *http.Request) {
		// Hold every request until the whole wave is in: wave connections
		// are open at once.
		arrived.Done()
		arrived.Wait()
		w.WriteHeader(http.StatusNoContent)
	})
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
	if n := dials.opened.Load(); n != wave {
		t.Fatalf("%d connections dialled for two waves of %d, want %d (the second reuses the first's)", n, wave, wave)
	}
}

// One endpoint's failures must not cost any other endpoint its pooled TLS
// connections. go-retryablehttp closes every idle connection of the client
// after each attempt it counts as failed; before keepIdle hid that from it,
// the healthy endpoint below was dialled again for almost every delivery
// (200 deliveries beside 5xx answers: about 200 handshakes).
func TestFailingEndpointKeepsOtherEndpointsConnections(t *testing.T) {
	const deliveries = 200 // to each endpoint
	cases := []struct {
		name    string
		workers int
		timeout time.Duration
		fail    http.HandlerFunc
		code    string
	}{
		{"5xx", 20, 5 * time.Second, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}, CodeHTTP5xx},
		// More workers, so 200 timeouts take 5 timeouts' time.
		{"timeout", 40, 2 * time.Second, func(w http.ResponseWriter, r *http.Request) {
			// Read to the end, so the server notices the sender closing the
			// connection when it gives up.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		}, CodeTimeout},
		{"reset", 20, 5 * time.Second, func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			_ = conn.(*tls.Conn).NetConn().(*net.TCPConn).SetLinger(0)
			_ = conn.Close()
		}, CodeConnectFailed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			healthy, healthyConns := countingServer(t, true, func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(http.StatusNoContent)
			})
			failing, failingConns := countingServer(t, true, tc.fail)
			pool := x509.NewCertPool()
			pool.AddCert(healthy.Certificate()) // both servers present httptest's one certificate
			s := newSender(t, Config{AllowLoopback: true, Timeout: tc.timeout, TLSConfig: &tls.Config{RootCAs: pool}, IdleConnsPerHost: tc.workers})

			// A healthy attempt that times out on a loaded machine closes its
			// own connection, so each one may explain one more dial.
			var healthyTimeouts atomic.Int32
			var wg sync.WaitGroup
			for range tc.workers {
				wg.Go(func() {
					for range deliveries / tc.workers {
						m := Message{ID: "msg-1", URL: failing.URL + "/hook", SecretRef: "ep", Body: []byte(`{"a":1}`)}
						if r, err := s.Send(context.Background(), m); err != nil || r.Code != tc.code {
							t.Errorf("failing endpoint: %+v %v, want code %q", r, err, tc.code)
						}
						m.URL = healthy.URL + "/hook"
						r, err := s.Send(context.Background(), m)
						switch {
						case err == nil && r.Verdict == Delivered:
						case err == nil && r.Code == CodeTimeout:
							healthyTimeouts.Add(1)
						default:
							t.Errorf("healthy endpoint: %+v %v", r, err)
						}
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				t.FailNow()
			}
			timeouts := int(healthyTimeouts.Load())
			t.Logf("new connections over %d deliveries each: healthy %d (%d of its attempts timed out), failing %d",
				deliveries, healthyConns.opened.Load(), timeouts, failingConns.opened.Load())
			if timeouts > deliveries/4 {
				t.Fatalf("%d of %d healthy attempts timed out: the machine is too loaded for this test to say anything", timeouts, deliveries)
			}
			// Each worker holds at most one healthy connection at a time, but a
			// connection goes back to the pool a moment after its body is closed,
			// and a dial started in that moment is kept too: allow twice as many.
			if n, limit := int(healthyConns.opened.Load()), 2*tc.workers+timeouts; n > limit {
				t.Fatalf("the healthy endpoint accepted %d connections for %d deliveries from %d workers, want at most %d: "+
					"the failing endpoint's attempts closed its pooled connections", n, deliveries, tc.workers, limit)
			}
		})
	}
}
