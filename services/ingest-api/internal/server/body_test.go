package server

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// heldBodyBytes reads the exported gauge, as a scrape would.
func (f *fixture) heldBodyBytes() int64 {
	f.t.Helper()
	return int64(counterValue(f.t, f.reg, "envelopeworker_ingest_inflight_body_bytes", nil))
}

// waitHeld waits until the gauge shows want bytes held.
func (f *fixture) waitHeld(want int64) {
	f.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		got := f.heldBodyBytes()
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("%d body bytes held, want %d", got, want)
		}
	}
}

// slowPost is a request on a raw connection whose body is sent in parts.
type slowPost struct {
	conn net.Conn
	body []byte
	sent int
}

func startSlowPost(t *testing.T, ts *httptest.Server, path, token string, body []byte, first int) *slowPost {
	t.Helper()
	c, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: ingest\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n",
		path, token, len(body))
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	p := &slowPost{conn: c, body: body}
	p.send(t, first)
	return p
}

func (p *slowPost) send(t *testing.T, n int) {
	t.Helper()
	if _, err := p.conn.Write(p.body[p.sent : p.sent+n]); err != nil {
		t.Fatal(err)
	}
	p.sent += n
}

// finish sends the rest of the body and reads the answer.
func (p *slowPost) finish(t *testing.T) resp {
	t.Helper()
	p.send(t, len(p.body)-p.sent)
	return p.answer(t)
}

func (p *slowPost) answer(t *testing.T) resp {
	t.Helper()
	res, err := http.ReadResponse(bufio.NewReader(p.conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	return readResp(t, res)
}

// readResp reads and closes an answer from a real connection.
func readResp(t *testing.T, res *http.Response) resp {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp{status: res.StatusCode, header: res.Header, body: b}
}

// TestInflightBodyBound: bodies are held against INGEST_MAX_INFLIGHT_BODY_BYTES
// as their bytes arrive; past the bound every route that reads a body
// answers 503 unavailable with Retry-After: 1 and commits nothing, routes
// without a body are served, and once the held bodies are done (answered,
// or their client gone) new requests are served again.
func TestInflightBodyBound(t *testing.T) {
	const limit = 256 << 10
	f := newFixture(t, func(c *Config) {
		c.MaxBodyBytes = limit
		c.MaxInflightBodyBytes = 2 * limit
	})
	ts := httptest.NewServer(f.srv.Handler())
	defer ts.Close()
	if got := f.heldBodyBytes(); got != 0 {
		t.Fatalf("%d bytes held before any request", got)
	}

	// Two valid envelopes, padded with white space to one byte under the
	// limit: once more than half has come, each holds a buffer of the whole
	// declared length (+1 to see its end), so the two fill the bound.
	padded := func(seq int64) []byte {
		d := draft(seq)
		d.Payload = []byte(`{"pad":"` + strings.Repeat("x", limit/2) + `"}`)
		b := f.sign(d)
		return append(b, bytes.Repeat([]byte(" "), limit-1-len(b))...)
	}
	a := startSlowPost(t, ts, "/v1/envelopes", f.device, padded(1), limit*3/4)
	b := startSlowPost(t, ts, "/v1/envelopes", f.device, padded(2), limit*3/4)
	f.waitHeld(2 * limit)

	refused := []req{
		{method: http.MethodPost, path: "/v1/envelopes", token: f.device, body: f.sign(draft(3))},
		{method: http.MethodPost, path: "/v1/envelopes/batch", token: f.device, body: batchBody(f.sign(draft(3)))},
		{method: http.MethodPost, path: "/v1/outbox", token: f.service, body: []byte(`{"project_id":"proj-1","topic":"t","idempotency_key":"k-1","kind":"proposal","payload":{}}`)},
	}
	for _, r := range refused {
		got := overHTTP(t, ts, r)
		wantAnswer(t, got, 503, "refused", "unavailable", -1)
		if got.header.Get("Retry-After") != "1" {
			t.Fatalf("%s: Retry-After %q", r.path, got.header.Get("Retry-After"))
		}
	}
	// A read carries no body and is served.
	if got := overHTTP(t, ts, req{method: http.MethodGet, path: "/v1/streams/proj-1/device-7", token: f.device}); got.status != 200 {
		t.Fatalf("stream state while bodies are held: %d %s", got.status, got.body)
	}
	if v := counterValue(t, f.reg, "envelopeworker_ingest_inflight_body_refusals_total", nil); v != float64(len(refused)) {
		t.Fatalf("%v refusals counted, want %d", v, len(refused))
	}
	if rows := f.audit(); len(rows) != 0 {
		t.Fatalf("%d audit rows after refusals, want none", len(rows))
	}

	// The held bodies complete and are answered as usual.
	wantAnswer(t, a.finish(t), 200, "accepted", "", 1)
	wantAnswer(t, b.finish(t), 200, "accepted", "", 2)
	f.waitHeld(0)
	wantAnswer(t, overHTTP(t, ts, refused[0]), 200, "accepted", "", 3)

	// A client that leaves part-way gives its bytes back too.
	gone := startSlowPost(t, ts, "/v1/envelopes", f.device, padded(4), limit/2)
	f.waitHeld(limit)
	_ = gone.conn.Close()
	f.waitHeld(0)

	rows := f.audit()
	if len(rows) != 3 {
		t.Fatalf("%d audit rows, want the 3 accepts", len(rows))
	}
	for _, r := range rows {
		if r.Outcome != string(outcomeAccepted) {
			t.Fatalf("audit row %+v", r)
		}
	}
	if p := f.readStream(t, f.service, projectA, deviceA, ""); p.Cursor != 3 || len(p.Envelopes) != 3 {
		t.Fatalf("stream after the bound: cursor %d, %d envelopes", p.Cursor, len(p.Envelopes))
	}
}

// TestBodyGrowsAsItArrives: an idle request holds firstBodyChunk however
// large the length it declared, and 413 stays as it was: a declared length
// over the limit is refused unread, holding nothing.
func TestBodyGrowsAsItArrives(t *testing.T) {
	f := newFixture(t)
	ts := httptest.NewServer(f.srv.Handler())
	defer ts.Close()
	p := startSlowPost(t, ts, "/v1/envelopes", f.device, make([]byte, 1<<20), 0)
	f.waitHeld(firstBodyChunk)
	p.send(t, 3000) // 512 -> 1 KiB -> 2 KiB -> 4 KiB
	f.waitHeld(4096)
	_ = p.conn.Close()
	f.waitHeld(0)

	// Declared over the limit: answered without reading, nothing held.
	over := startSlowPost(t, ts, "/v1/envelopes", f.device, make([]byte, 1<<20+1), 0)
	wantAnswer(t, over.answer(t), 413, "refused", "body_too_large", -1)
	f.waitHeld(0)
}

// overHTTP runs one request over a real connection of its own.
func overHTTP(t *testing.T, ts *httptest.Server, r req) resp {
	t.Helper()
	hr, err := http.NewRequest(r.method, ts.URL+r.path, bytes.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	if r.token != "" {
		hr.Header.Set("Authorization", "Bearer "+r.token)
	}
	if r.body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	defer client.CloseIdleConnections()
	res, err := client.Do(hr)
	if err != nil {
		t.Fatal(err)
	}
	return readResp(t, res)
}

// TestInflightBodyBoundConfig: the bound defaults to 64 MiB and must exceed
// the body limit, or a body of the largest size could never be taken.
func TestInflightBodyBoundConfig(t *testing.T) {
	f := newFixture(t)
	if f.srv.bodies.max != DefaultMaxInflightBodyBytes || DefaultMaxInflightBodyBytes != 64<<20 {
		t.Fatalf("default bound %d", f.srv.bodies.max)
	}
	for _, c := range []struct{ body, inflight int64 }{{0, 1 << 20}, {0, -1}, {1000, 1000}} {
		cfg := testConfig()
		cfg.MaxBodyBytes, cfg.MaxInflightBodyBytes = c.body, c.inflight
		if _, err := New(cfg, f.st, slog.New(slog.DiscardHandler), NewRegistry()); !errors.Is(err, ErrConfig) {
			t.Errorf("body limit %d, bound %d: %v", c.body, c.inflight, err)
		}
	}
}
