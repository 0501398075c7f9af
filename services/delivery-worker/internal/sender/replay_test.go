package sender

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// A receiver that reads a request and then drops the connection without an answer may have acted on
// it. net/http's Transport replays a request that has an Idempotency-Key header and a rewindable body
// when a reused connection fails that way, which would make one attempt two POSTs (found by the chaos
// run, tools/internal/chaos: the sink got more requests than the message had attempts). An attempt is
// one request: the failure is the attempt's result, and the outbox retries it under a new attempt.
func TestAttemptIsOneRequestWhenAReusedConnectionDrops(t *testing.T) {
	var requests atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 1 {
			w.WriteHeader(http.StatusNoContent) // leaves a keep-alive connection for the next attempt
			return
		}
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return
		}
		_ = conn.(*net.TCPConn).SetLinger(0)
		_ = conn.Close() // read the whole request, then reset: no response byte
	}))
	t.Cleanup(srv.Close)
	s := newSender(t, Config{AllowLoopback: true})
	msg := Message{ID: "msg-1", URL: srv.URL + "/hook", SecretRef: "ep", Body: []byte(`{"a":1}`)}

	if r, err := s.Send(context.Background(), msg); err != nil || r.Verdict != Delivered {
		t.Fatalf("first attempt: %+v %v", r, err)
	}
	r, err := s.Send(context.Background(), msg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Verdict != Retry {
		t.Errorf("reset attempt: %+v, want a retry", r)
	}
	if n := requests.Load(); n != 2 {
		t.Fatalf("the receiver got %d requests for 2 attempts", n)
	}
}
