package loadgen

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestConnKeepsAliveAndRedialsAfterClose(t *testing.T) {
	var conns atomic.Int32
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.Method != http.MethodPost || r.URL.Path != "/base/v1/envelopes" || r.Header.Get("Authorization") != "Bearer tok" ||
			r.Header.Get("Content-Type") != "application/json" || r.ContentLength != int64(len(b)) {
			http.Error(w, "bad request shape", http.StatusTeapot)
			return
		}
		i := n.Add(1)
		if i%3 == 0 {
			w.Header().Set("Connection", "close") // the server hangs up after this answer
		}
		if i%2 == 0 {
			w.(http.Flusher).Flush() // a chunked answer
		}
		_, _ = io.WriteString(w, `{"echo":`+string(b)+`}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	u, _ := url.Parse(srv.URL + "/base")
	c := newConn(u, "/v1/envelopes", "tok")
	defer c.close()
	for i := range 9 {
		body := `{"i":` + string(rune('0'+i)) + `}`
		status, b, err := c.post(context.Background(), []byte(body))
		if err != nil || status != 200 || string(b) != `{"echo":`+body+`}` {
			t.Fatalf("post %d: %d %q %v", i, status, b, err)
		}
	}
	// Every third answer closed its connection: 9 posts on 3 connections.
	if got := conns.Load(); got != 3 {
		t.Fatalf("%d connections for 9 posts, want 3", got)
	}
}

func TestConnTransportErrorsThenRecovers(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			// Hang up without an answer.
			hj, _ := w.(http.Hijacker)
			nc, _, _ := hj.Hijack()
			_ = nc.Close()
			return
		}
		_, _ = io.WriteString(w, `{"outcome":"accepted"}`)
	}))
	defer srv.Close()
	u, _ := url.Parse(srv.URL)
	c := newConn(u, "/v1/envelopes", "tok")
	defer c.close()
	if _, _, err := c.post(context.Background(), []byte(`{}`)); err == nil {
		t.Fatal("a hang-up was not an error")
	}
	status, b, err := c.post(context.Background(), []byte(`{}`))
	if err != nil || status != 200 || !strings.Contains(string(b), "accepted") {
		t.Fatalf("after the hang-up: %d %q %v", status, b, err)
	}
}

func TestConnDeadlineAndCancel(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-release
	}))
	defer srv.Close()
	defer close(release)
	u, _ := url.Parse(srv.URL)
	c := newConn(u, "/v1/envelopes", "tok")
	defer c.close()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, _, err := c.post(ctx, []byte(`{}`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("past its deadline: %v", err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel2)
	if _, _, err := c.post(ctx2, []byte(`{}`)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}
