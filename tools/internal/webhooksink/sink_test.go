package webhooksink

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The known-answer case of the contract's vectors/webhooks.json.
const (
	vecSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vecID     = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vecTS     = "1614265330"
	vecBody   = `{"test": 2432232314}`
	vecSig    = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

var now = time.Unix(1614265330, 0)

func mustSecret(t testing.TB, s string) []byte {
	t.Helper()
	k, err := ParseSecret(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func sign(key []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

type harness struct {
	sink *Sink
	out  *bytes.Buffer
}

func newHarness(t *testing.T, pub ed25519.PublicKey, secrets ...[]byte) harness {
	t.Helper()
	out := &bytes.Buffer{}
	s, err := New(Config{Secrets: secrets, EnvelopeKey: pub, Now: func() time.Time { return now }, Out: out})
	if err != nil {
		t.Fatal(err)
	}
	return harness{sink: s, out: out}
}

func (h harness) send(method string, headers map[string]string, body []byte) (int, Line) {
	r := httptest.NewRequest(method, "/hook", bytes.NewReader(body))
	for k, v := range headers {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	before := h.out.Len()
	h.sink.ServeHTTP(w, r)
	var l Line
	line := h.out.Bytes()[before:]
	if err := json.Unmarshal(line, &l); err != nil {
		panic("sink printed no JSON line: " + string(line))
	}
	return w.Code, l
}

func headers(id, ts, sig string) map[string]string {
	return map[string]string{"webhook-id": id, "webhook-timestamp": ts, "webhook-signature": sig}
}

func TestKnownAnswerVector(t *testing.T) {
	h := newHarness(t, nil, mustSecret(t, vecSecret))
	if !h.sink.signed(vecID, vecTS, []byte(vecBody), vecSig) {
		t.Fatal("the known-answer signature does not verify")
	}
	if h.sink.signed(vecID, vecTS, []byte(vecBody+" "), vecSig) {
		t.Fatal("a changed body verifies")
	}
	// The vector's body is not an envelope: the signature passes, the
	// envelope check refuses.
	code, l := h.send(http.MethodPost, headers(vecID, vecTS, vecSig), []byte(vecBody))
	if code != 422 || l.Reason != "bad_envelope" || l.WebhookID != vecID {
		t.Fatalf("%d %+v", code, l)
	}
}

func signedEnvelope(t *testing.T, priv ed25519.PrivateKey) []byte {
	t.Helper()
	env, err := envelope.Sign(envelope.Draft{
		TenantID: "demo", ProjectID: "p1", ProducerID: "svc-1", EventID: "ob-1", IdempotencyKey: "k-1",
		KeyID: "out-1", Sequence: 3, IssuedAt: now, Metadata: envelope.Metadata{Kind: "proposal"},
		Payload: []byte(`{"x":1}`),
	}, priv)
	if err != nil {
		t.Fatal(err)
	}
	return env.Canonical()
}

func TestDeliveries(t *testing.T) {
	pub, priv, _ := ed25519.GenerateKey(nil)
	key := mustSecret(t, vecSecret)
	old := bytes.Repeat([]byte{1}, 32)
	h := newHarness(t, pub, key)
	body := signedEnvelope(t, priv)
	ts := strconv.FormatInt(now.Unix(), 10)
	good := headers("msg_1", ts, sign(old, "msg_1", ts, body)+" v1a,AAAA "+sign(key, "msg_1", ts, body))

	for i := 1; i <= 2; i++ {
		code, l := h.send(http.MethodPost, good, body)
		if code != 204 || l.Result != "accepted" || l.Delivery != i || string(l.Payload) != `{"x":1}` ||
			l.Envelope == nil || l.Envelope.Signature != "verified" || l.Envelope.Sequence != 3 ||
			l.Envelope.Kind != "proposal" || l.Envelope.TenantID != "demo" {
			t.Fatalf("delivery %d: %d %+v", i, code, l)
		}
	}

	_, otherPriv, _ := ed25519.GenerateKey(nil)
	forged := signedEnvelope(t, otherPriv)
	stale := strconv.FormatInt(now.Add(-6*time.Minute).Unix(), 10)
	spaced := append([]byte(" "), body...)
	cases := []struct {
		name    string
		method  string
		headers map[string]string
		body    []byte
		status  int
		reason  string
	}{
		{"get", http.MethodGet, good, nil, 405, "method_not_allowed"},
		{"no id", http.MethodPost, headers("", ts, sign(key, "", ts, body)), body, 400, "missing_headers"},
		{"no signature", http.MethodPost, headers("msg_1", ts, ""), body, 400, "missing_headers"},
		{"wrong secret", http.MethodPost, headers("msg_1", ts, sign(old, "msg_1", ts, body)), body, 401, "bad_signature"},
		{"other id", http.MethodPost, headers("msg_2", ts, sign(key, "msg_1", ts, body)), body, 401, "bad_signature"},
		{"not base64", http.MethodPost, headers("msg_1", ts, "v1,!!!"), body, 401, "bad_signature"},
		{"stale", http.MethodPost, headers("msg_1", stale, sign(key, "msg_1", stale, body)), body, 401, "stale_timestamp"},
		{"bad timestamp", http.MethodPost, headers("msg_1", "soon", sign(key, "msg_1", "soon", body)), body, 401, "stale_timestamp"},
		{"other key's envelope", http.MethodPost, headers("msg_1", ts, sign(key, "msg_1", ts, forged)), forged, 422, "bad_envelope"},
		{"not canonical", http.MethodPost, headers("msg_1", ts, sign(key, "msg_1", ts, spaced)), spaced, 422, "bad_envelope"},
		{"too large", http.MethodPost, good, bytes.Repeat([]byte(" "), MaxBody+1), 413, "body_too_large"},
	}
	for _, tc := range cases {
		code, l := h.send(tc.method, tc.headers, tc.body)
		if code != tc.status || l.Result != "refused" || l.Reason != tc.reason || l.Payload != nil {
			t.Errorf("%s: %d %+v, want %d %s", tc.name, code, l, tc.status, tc.reason)
		}
	}
}

func TestParseSecret(t *testing.T) {
	for _, s := range []string{"", "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_", "whsec_!!!!",
		"whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 23)),
		"whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 65))} {
		if _, err := ParseSecret(s); err == nil || strings.Contains(err.Error(), "MfKQ") {
			t.Errorf("ParseSecret(%q) = %v", s, err)
		}
	}
	if k, err := ParseSecret(" whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 32)) + "\n"); err != nil || len(k) != 32 {
		t.Fatalf("32-byte secret: %d %v", len(k), err)
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("a sink without secrets")
	}
}

func TestRun(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte("\n"+vecSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badFile := filepath.Join(dir, "bad")
	if err := os.WriteFile(badFile, []byte("whsec_short-secret-material\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{}, {"--secret-file", filepath.Join(dir, "absent")}, {"--secret-file", badFile},
		{"--secret-file", secretFile, "--envelope-public-key", "AAAA"}, {"--secret-file", secretFile, "extra"},
		{"--nope"},
	} {
		var stderr bytes.Buffer
		if code := Run(context.Background(), args, io.Discard, &stderr, nil); code != 2 || strings.Contains(stderr.String(), "short-secret-material") {
			t.Errorf("%v: exit %d, %s", args, code, stderr.String())
		}
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, priv, _ := ed25519.GenerateKey(nil)
	ready := make(chan net.Addr, 1)
	done := make(chan int, 1)
	var stdout syncBuffer
	go func() {
		done <- Run(ctx, []string{"--addr", "127.0.0.1:0", "--secret-file", secretFile,
			"--envelope-public-key", base64.RawURLEncoding.EncodeToString(pub), "--tolerance", "87600h"},
			&stdout, io.Discard, func(a net.Addr) { ready <- a })
	}()
	var addr net.Addr
	select {
	case addr = <-ready:
	case code := <-done:
		t.Fatalf("Run exited %d", code)
	}
	body := signedEnvelope(t, priv)
	req, _ := http.NewRequest(http.MethodPost, "http://"+addr.String()+"/", bytes.NewReader(body))
	for k, v := range headers("msg_9", vecTS, sign(mustSecret(t, vecSecret), "msg_9", vecTS, body)) {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	http.DefaultClient.CloseIdleConnections()
	if res.StatusCode != 204 || !strings.Contains(stdout.String(), `"result":"accepted","webhook_id":"msg_9"`) ||
		!strings.Contains(stdout.String(), `"signature":"verified"`) {
		t.Fatalf("%d %s", res.StatusCode, stdout.String())
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d", code)
	}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
