package sender

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
)

var testSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef01234567"))

func secretsFor(ref string) []secrets.Secret {
	if ref != "ep" {
		return nil
	}
	s, err := secrets.ParseSecret(testSecret)
	if err != nil {
		panic(err)
	}
	return []secrets.Secret{s}
}

func newSender(t *testing.T, cfg Config) *Sender {
	t.Helper()
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.Secrets == nil {
		cfg.Secrets = secretsFor
	}
	cfg.Backoff = Backoff{Base: time.Second, Cap: time.Minute}
	s := New(cfg)
	t.Cleanup(s.Close)
	return s
}

func send(t *testing.T, s *Sender, url string) Result {
	t.Helper()
	r, err := s.Send(context.Background(), Message{ID: "msg-1", URL: url, SecretRef: "ep", Body: []byte(`{"a":1}`)})
	if err != nil {
		t.Fatalf("Send: %v", err)
	}
	return r
}

func TestDeliversSignedRequest(t *testing.T) {
	var got atomic.Pointer[http.Request]
	var body atomic.Pointer[[]byte]
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 64)
		n, _ := r.Body.Read(b)
		b = b[:n]
		body.Store(&b)
		got.Store(r)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	s := newSender(t, Config{AllowLoopback: true})
	if r := send(t, s, srv.URL+"/hook?x=1"); r.Verdict != Delivered || r.Code != "" || r.Status != 204 {
		t.Fatalf("result %+v", r)
	}
	req := got.Load()
	if req.Method != http.MethodPost || req.URL.RawQuery != "x=1" || req.Header.Get("Idempotency-Key") != "msg-1" ||
		req.Header.Get("webhook-id") != "msg-1" || req.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("request %s %s headers %v", req.Method, req.URL, req.Header)
	}
	if string(*body.Load()) != `{"a":1}` {
		t.Fatalf("body %q", *body.Load())
	}
	wh, _ := standardwebhooks.NewWebhook(testSecret)
	if err := wh.Verify(*body.Load(), req.Header); err != nil {
		t.Fatalf("official library refuses the delivery: %v", err)
	}
}

func TestClassifyStatuses(t *testing.T) {
	cases := []struct {
		status  int
		header  string
		verdict Verdict
		code    string
		disable bool
		ra      time.Duration
	}{
		{200, "", Delivered, "", false, 0},
		{201, "", Delivered, "", false, 0},
		{299, "", Delivered, "", false, 0},
		{301, "", Dead, CodeRedirectRefused, false, 0},
		{302, "", Dead, CodeRedirectRefused, false, 0},
		{304, "", Dead, CodeRedirectRefused, false, 0},
		{307, "", Dead, CodeRedirectRefused, false, 0},
		{308, "", Dead, CodeRedirectRefused, false, 0},
		{400, "", Dead, CodeHTTP4xx, false, 0},
		{401, "", Dead, CodeHTTP4xx, false, 0},
		{403, "", Dead, CodeHTTP4xx, false, 0},
		{404, "", Dead, CodeHTTP4xx, false, 0},
		{408, "", Retry, CodeHTTP4xx, false, 0}, // retried, recorded as the generic http_4xx
		{409, "", Dead, CodeHTTP4xx, false, 0},
		{410, "", Dead, CodeHTTP410, true, 0},
		{413, "", Dead, CodeHTTP4xx, false, 0},
		{422, "", Dead, CodeHTTP4xx, false, 0},
		{429, "", Retry, CodeHTTP429, false, 0},
		{429, "7", Retry, CodeHTTP429, false, 7 * time.Second},
		{500, "", Retry, CodeHTTP5xx, false, 0},
		{500, "7", Retry, CodeHTTP5xx, false, 0}, // Retry-After only honoured on 429 (contract §4)
		{502, "", Retry, CodeHTTP5xx, false, 0},
		{503, "120", Retry, CodeHTTP5xx, false, 0},
		{504, "", Retry, CodeHTTP5xx, false, 0},
		{599, "", Retry, CodeHTTP5xx, false, 0},
	}
	now := time.Now()
	for _, c := range cases {
		resp := &http.Response{StatusCode: c.status, Header: http.Header{}}
		if c.header != "" {
			resp.Header.Set("Retry-After", c.header)
		}
		r := Classify(resp, nil, now)
		if r.Verdict != c.verdict || r.Code != c.code || r.DisableEndpoint != c.disable || r.RetryAfter != c.ra || r.Status != c.status {
			t.Errorf("status %d: %+v, want %v %q disable=%v ra=%v", c.status, r, c.verdict, c.code, c.disable, c.ra)
		}
	}
}

func TestClassifyErrors(t *testing.T) {
	cases := []struct {
		name    string
		err     error
		verdict Verdict
		code    string
	}{
		{"deadline", context.DeadlineExceeded, Retry, CodeTimeout},
		{"net timeout", &net.OpError{Op: "dial", Err: timeoutErr{}}, Retry, CodeTimeout},
		{"refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, Retry, CodeConnectFailed},
		{"tls unknown authority", &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}}, Retry, CodeTLSFailed},
		{"tls hostname", x509.HostnameError{Host: "h"}, Retry, CodeTLSFailed},
		{"tls record", tls.RecordHeaderError{Msg: "x"}, Retry, CodeTLSFailed},
		{"insecure url", errInsecureURL, Dead, CodeBlockedAddress},
	}
	for _, c := range cases {
		r := Classify(nil, c.err, time.Now())
		if r.Verdict != c.verdict || r.Code != c.code {
			t.Errorf("%s: %+v, want %v %s", c.name, r, c.verdict, c.code)
		}
	}
}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	cases := map[string]time.Duration{
		"":                               0,
		"0":                              0,
		"5":                              5 * time.Second,
		" 30 ":                           30 * time.Second,
		"-1":                             0,
		"1.5":                            0,
		"soon":                           0,
		"99999999999999999999":           0, // out of range for uint63
		"9223372036":                     9223372036 * time.Second,
		"Sun, 29 Nov 2026 20:01:30 GMT":  90 * time.Second,
		"Sunday, 29-Nov-26 20:00:10 GMT": 10 * time.Second,
		"Sun, 29 Nov 2026 19:59:00 GMT":  0, // in the past
	}
	for in, want := range cases {
		if got := ParseRetryAfter(in, now); got != want {
			t.Errorf("ParseRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
	if got := ParseRetryAfter("9223372036854775807", now); got <= 0 {
		t.Errorf("huge Retry-After overflowed to %v", got)
	}
}

func TestBackoffSchedule(t *testing.T) {
	b := Backoff{Base: time.Second, Cap: 10 * time.Minute}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 600, 600, 600}
	for i, w := range want {
		if got := b.Delay(i+1, 0); got != w*time.Second {
			t.Errorf("attempt %d: %v, want %v", i+1, got, w*time.Second)
		}
	}
	if got := b.Delay(1000, 0); got != 10*time.Minute {
		t.Errorf("attempt 1000: %v (overflow?)", got)
	}
	// Retry-After: honoured when longer than the backoff, capped.
	if got := b.Delay(1, 30*time.Second); got != 30*time.Second {
		t.Errorf("Retry-After 30s at attempt 1: %v", got)
	}
	if got := b.Delay(1, time.Hour); got != 10*time.Minute {
		t.Errorf("Retry-After 1h: %v, want the cap", got)
	}
	if got := b.Delay(8, time.Second); got != 128*time.Second {
		t.Errorf("short Retry-After shortened the backoff: %v", got)
	}

	// Jitter is added, within [d, (1+J)·d] and never past the cap, so a retry
	// never comes before min(cap, base·2^(attempt−1)); at the cap it is taken
	// off instead, within [(1-J)·cap, cap].
	for _, r := range []float64{0, 0.5, 0.999999} {
		j := Backoff{Base: time.Second, Cap: 10 * time.Minute, Jitter: 0.2, Rand: func() float64 { return r }}
		for attempt := 1; attempt <= 12; attempt++ {
			d := b.Delay(attempt, 0)
			got := j.Delay(attempt, 0)
			lo, hi := d, d+d/5
			if d+time.Duration(float64(d)*0.2*r) > b.Cap {
				lo, hi = d-d/5, d
			}
			if got < lo || got > hi || got > b.Cap {
				t.Errorf("jitter r=%v attempt %d: %v not in [%v, %v]", r, attempt, got, lo, hi)
			}
		}
	}
	// The retryablehttp hook counts from 0 and reads Retry-After on 429.
	resp := &http.Response{StatusCode: 429, Header: http.Header{"Retry-After": {"45"}}}
	if got := b.RetryableHTTPBackoff(0, 0, 0, resp); got != 45*time.Second {
		t.Errorf("hook with Retry-After: %v", got)
	}
	if got := b.RetryableHTTPBackoff(0, 0, 2, nil); got != 4*time.Second {
		t.Errorf("hook attempt index 2: %v", got)
	}
}

func TestRealStatusesAndRetryAfter(t *testing.T) {
	var status atomic.Int32
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Header().Set("Retry-After", "20")
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	s := newSender(t, Config{AllowLoopback: true})
	for _, c := range []struct {
		status int
		v      Verdict
		code   string
	}{{200, Delivered, ""}, {410, Dead, CodeHTTP410}, {429, Retry, CodeHTTP429}, {503, Retry, CodeHTTP5xx}, {404, Dead, CodeHTTP4xx}, {408, Retry, CodeHTTP4xx}} {
		status.Store(int32(c.status))
		before := hits.Load()
		r := send(t, s, srv.URL)
		if r.Verdict != c.v || r.Code != c.code {
			t.Errorf("status %d: %+v", c.status, r)
		}
		// RetryMax 0: one attempt is one request, whatever the status.
		if n := hits.Load() - before; n != 1 {
			t.Errorf("status %d: %d requests, want 1", c.status, n)
		}
		if c.status == 429 {
			if d := s.NextAttemptDelay(1, r); d != 20*time.Second {
				t.Errorf("status %d: next delay %v, want Retry-After 20s", c.status, d)
			}
		}
	}
}

func TestRedirectNeverFollowed(t *testing.T) {
	var targetHits atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { targetHits.Add(1) }))
	defer target.Close()
	for _, code := range []int{301, 302, 303, 307, 308} {
		redirector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+"/stolen", code)
		}))
		s := newSender(t, Config{AllowLoopback: true})
		if r := send(t, s, redirector.URL); r.Verdict != Dead || r.Code != CodeRedirectRefused {
			t.Errorf("%d: %+v", code, r)
		}
		redirector.Close()
	}
	if n := targetHits.Load(); n != 0 {
		t.Fatalf("redirect target contacted %d times", n)
	}
}

func TestBlockedAddresses(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	strict := newSender(t, Config{Timeout: 2 * time.Second})
	loose := newSender(t, Config{Timeout: 2 * time.Second, AllowLoopback: true})
	cases := []struct {
		name string
		s    *Sender
		url  string
	}{
		{"loopback https", strict, "https://127.0.0.1:" + port + "/"},
		{"loopback http without flag", strict, "http://127.0.0.1:" + port + "/"},
		{"localhost without flag", strict, "https://localhost:" + port + "/"},
		{"metadata", loose, "https://169.254.169.254/latest/meta-data"},
		{"metadata over http", loose, "http://169.254.169.254/"},
		{"private 10/8", loose, "https://10.1.2.3/"},
		{"ula", loose, "https://[fc00::1]/"},
		{"mapped loopback", strict, "https://[::ffff:127.0.0.1]:" + port + "/"},
		{"mapped private", loose, "https://[::ffff:10.0.0.1]/"},
		{"unspecified", loose, "https://0.0.0.0:" + port + "/"},
		{"plain http to public", loose, "http://93.184.216.34/"},
		{"ftp", loose, "ftp://127.0.0.1/"},
		{"user info", loose, "https://u:p@127.0.0.1:" + port + "/"},
		{"no host", loose, "https:///x"},
	}
	for _, c := range cases {
		if r := send(t, c.s, c.url); r.Verdict != Dead || r.Code != CodeBlockedAddress {
			t.Errorf("%s: %+v, want dead blocked_address", c.name, r)
		}
	}
	if n := hits.Load(); n != 0 {
		t.Fatalf("blocked destination contacted %d times", n)
	}
}

// fakeDNS is a resolver answering every A query with addr, so a public-looking
// name can be made to resolve to loopback (dnsServer in ssrf_test.go).
func fakeDNS(addr netip.Addr) *net.Resolver {
	d := &dnsServer{}
	d.set(answers(addr.String()))
	return d.resolver()
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func TestHostnameResolvingToLoopback(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	tlsCfg := &tls.Config{RootCAs: pool}
	// httptest's certificate is valid for example.com; the fake resolver
	// sends example.com to 127.0.0.1.
	url := "https://example.com:" + port + "/hook"
	resolver := fakeDNS(netip.MustParseAddr("127.0.0.1"))

	strict := newSender(t, Config{Resolver: resolver, TLSConfig: tlsCfg})
	if r := send(t, strict, url); r.Verdict != Dead || r.Code != CodeBlockedAddress {
		t.Fatalf("name resolving to loopback: %+v, want dead blocked_address", r)
	}
	if hits.Load() != 0 {
		t.Fatal("server contacted although loopback is refused")
	}
	loose := newSender(t, Config{Resolver: resolver, TLSConfig: tlsCfg, AllowLoopback: true})
	if r := send(t, loose, url); r.Verdict != Delivered {
		t.Fatalf("with loopback allowed: %+v", r)
	}
	// Plain http to a name is refused even under the flag unless the name is
	// a loopback name; example.com is not.
	if r := send(t, loose, "http://example.com:"+port+"/"); r.Verdict != Dead || r.Code != CodeBlockedAddress {
		t.Fatalf("plain http to a name: %+v", r)
	}
	if hits.Load() != 1 {
		t.Fatalf("hits %d, want 1", hits.Load())
	}
	// A name resolving to the metadata address is refused with the flag too.
	meta := newSender(t, Config{Resolver: fakeDNS(netip.MustParseAddr("169.254.169.254")), AllowLoopback: true, Timeout: 2 * time.Second})
	if r := send(t, meta, "https://example.com/"); r.Verdict != Dead || r.Code != CodeBlockedAddress {
		t.Fatalf("name resolving to 169.254.169.254: %+v", r)
	}
}

func TestTLSFailureAndConnectFailure(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer srv.Close()
	s := newSender(t, Config{AllowLoopback: true}) // no root CA: unknown authority
	if r := send(t, s, srv.URL); r.Verdict != Retry || r.Code != CodeTLSFailed {
		t.Fatalf("untrusted certificate: %+v", r)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	if r := send(t, s, "http://"+addr+"/"); r.Verdict != Retry || r.Code != CodeConnectFailed {
		t.Fatalf("connection refused: %+v", r)
	}
}

func TestTimeoutAndAbort(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	s := newSender(t, Config{AllowLoopback: true, Timeout: 50 * time.Millisecond})
	if r := send(t, s, srv.URL); r.Verdict != Retry || r.Code != CodeTimeout {
		t.Fatalf("slow receiver: %+v", r)
	}
	s2 := newSender(t, Config{AllowLoopback: true, Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s2.Send(ctx, Message{ID: "m", URL: srv.URL, SecretRef: "ep"})
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, ErrAborted) {
		t.Fatalf("cancelled attempt: %v, want ErrAborted", err)
	}
}

func TestNoSecretSendsNothing(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1) }))
	defer srv.Close()
	s := newSender(t, Config{AllowLoopback: true})
	r, err := s.Send(context.Background(), Message{ID: "m", URL: srv.URL, SecretRef: "unknown"})
	if err != nil || r.Verdict != Retry || r.Code != CodeNoSecret {
		t.Fatalf("%+v %v", r, err)
	}
	if hits.Load() != 0 {
		t.Fatal("sent without a secret")
	}
}
