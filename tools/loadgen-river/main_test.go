package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// The Standard Webhooks specification's example, which the worker's signer
// also meets.
func TestSignatureSpecVector(t *testing.T) {
	key, err := base64.StdEncoding.DecodeString("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") // whsec_ stripped
	if err != nil {
		t.Fatal(err)
	}
	got := signature(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Fatalf("signature = %q, want %q", got, want)
	}
}

func TestSinkLatencyAndPostWork(t *testing.T) {
	const latency = 50 * time.Millisecond
	snk, err := startSink(latency)
	if err != nil {
		t.Fatal(err)
	}
	defer snk.Close()

	start := time.Now()
	resp, err := http.Post(snk.url, "application/json", bytes.NewReader([]byte(`{}`)))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if elapsed := time.Since(start); elapsed < latency {
		t.Errorf("sink answered after %v, before its latency %v", elapsed, latency)
	}
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("sink status %d, want 204", resp.StatusCode)
	}

	w := newPostWorker(snk.url, 1)
	job := &river.Job[postArgs]{JobRow: &rivertype.JobRow{ID: 7, EncodedArgs: []byte(`{"pad":"xx"}`)}}
	if err := w.Work(context.Background(), job); err != nil {
		t.Fatalf("Work: %v", err)
	}
	if n := snk.receipts.Load(); n != 2 {
		t.Errorf("sink receipts %d, want 2", n)
	}
}

// Work sends the worker's headers, and a non-2xx answer is an error (for
// River to retry).
func TestPostWorkHeadersAndNon2xx(t *testing.T) {
	var got http.Header
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, body = r.Header.Clone(), must(io.ReadAll(r.Body))
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	w := newPostWorker(srv.URL, 1)
	args := []byte(`{"pad":"x"}`)
	job := &river.Job[postArgs]{JobRow: &rivertype.JobRow{ID: 42, EncodedArgs: args}}
	if err := w.Work(context.Background(), job); err == nil {
		t.Error("Work succeeded on a 503")
	}
	ts, _ := strconv.ParseInt(got.Get("webhook-timestamp"), 10, 64)
	for h, want := range map[string]string{
		"webhook-id":        "42",
		"Idempotency-Key":   "42",
		"Content-Type":      "application/json",
		"webhook-signature": signature(w.key, "42", ts, args),
	} {
		if got.Get(h) != want {
			t.Errorf("%s = %q, want %q", h, got.Get(h), want)
		}
	}
	if !bytes.Equal(body, args) {
		t.Errorf("body %q, want the encoded args %q", body, args)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Bad command lines are refused with exit 2 before anything connects.
func TestRunMainRefusesBadCommandLines(t *testing.T) {
	t.Setenv("DATABASE_URL", "")
	for _, args := range [][]string{
		{}, // no database
		{"--database-url", "postgres://x/y", "--jobs", "1"},
		{"--database-url", "postgres://x/y", "--work", "sleep"},
		{"--database-url", "postgres://x/y", "--work", "post", "--sink-latency", "-1ms"},
		{"--no-such-flag"},
	} {
		var out, errw bytes.Buffer
		if code := runMain(context.Background(), args, &out, &errw); code != 2 || out.Len() != 0 {
			t.Errorf("%q: exit %d, stdout %q; want 2 and nothing", args, code, out.String())
		}
	}
}
