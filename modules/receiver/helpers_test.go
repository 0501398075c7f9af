package receiver

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// testNow is the fixed clock of the tests.
var testNow = time.Unix(1_800_000_000, 0)

var (
	hmacKey       = bytes.Repeat([]byte{7}, 32)
	hmacSecret    = "whsec_" + base64.StdEncoding.EncodeToString(hmacKey)
	whPriv        = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, 32))
	whPublic      = "whpk_" + base64.StdEncoding.EncodeToString(whPriv.Public().(ed25519.PublicKey))
	envPriv       = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{3}, 32))
	envPublicText = base64.RawURLEncoding.EncodeToString(envPriv.Public().(ed25519.PublicKey))
)

// signedEnvelope is a canonical outbound envelope of tenant t1 under key k1.
func signedEnvelope(t testing.TB, seq int64) []byte {
	t.Helper()
	e, err := envelope.Sign(envelope.Draft{
		TenantID: "t1", ProjectID: "p1", ProducerID: "svc", EventID: "e-" + strconv.FormatInt(seq, 10),
		IdempotencyKey: "k-" + strconv.FormatInt(seq, 10), KeyID: "k1", Sequence: seq,
		IssuedAt: testNow.Add(-time.Hour), Metadata: envelope.Metadata{Kind: "proposal"},
		Payload: []byte(`{"n":1}`),
	}, envPriv)
	if err != nil {
		t.Fatal(err)
	}
	return e.Canonical()
}

func v1Entry(key []byte, id, ts string, body []byte) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(id + "." + ts + "."))
	m.Write(body)
	return "v1," + base64.StdEncoding.EncodeToString(m.Sum(nil))
}

func v1aEntry(priv ed25519.PrivateKey, id, ts string, body []byte) string {
	msg := append([]byte(id+"."+ts+"."), body...)
	return "v1a," + base64.StdEncoding.EncodeToString(ed25519.Sign(priv, msg))
}

func newTestVerifier(t testing.TB) *Verifier {
	t.Helper()
	keys, err := StaticKeys(map[string]string{"k1": envPublicText})
	if err != nil {
		t.Fatal(err)
	}
	v, err := New(Config{Secrets: []string{hmacSecret, whPublic}, Keys: keys, Tenant: "t1",
		Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func delivery(id string, ts time.Time, body []byte, sig string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, "/hook", bytes.NewReader(body))
	r.Header.Set(HeaderID, id)
	r.Header.Set(HeaderTimestamp, strconv.FormatInt(ts.Unix(), 10))
	r.Header.Set(HeaderSignature, sig)
	r.Header.Set("Content-Type", "application/json")
	return r
}

// memReceipts is an in-memory Receipts for the handler tests (pgreceipts
// has the PostgreSQL one and its own tests).
type memReceipts struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (m *memReceipts) Handle(ctx context.Context, id string, effect func(context.Context, *int) error) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen[id] {
		return true, nil
	}
	var tx int
	if err := effect(ctx, &tx); err != nil {
		return false, err
	}
	if m.seen == nil {
		m.seen = map[string]bool{}
	}
	m.seen[id] = true
	return false, nil
}

func reasonOf(t testing.TB, w *httptest.ResponseRecorder) string {
	t.Helper()
	b := w.Body.String()
	_, rest, ok := strings.Cut(b, `"reason":"`)
	if !ok {
		return ""
	}
	code, _, _ := strings.Cut(rest, `"`)
	return code
}
