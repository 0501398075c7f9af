package sender

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// BenchmarkSend is one signed attempt over loopback HTTP/1.1 with a reused
// connection: the worker's per-message cost outside the database.
func BenchmarkSend(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer srv.Close()
	s := New(Config{Timeout: 5 * time.Second, AllowLoopback: true, Secrets: secretsFor, Backoff: Backoff{Base: time.Second, Cap: time.Minute}})
	defer s.Close()
	m := Message{ID: "msg_0123456789abcdef01234567", URL: srv.URL + "/hook", SecretRef: "ep", Body: make([]byte, 2048)}
	b.ReportAllocs()
	for b.Loop() {
		r, err := s.Send(context.Background(), m)
		if err != nil || r.Verdict != Delivered {
			b.Fatalf("%+v %v", r, err)
		}
	}
}
