package signer

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
)

type vector struct {
	Secret    string `json:"secret"`
	ID        string `json:"webhook_id"`
	Timestamp string `json:"webhook_timestamp"`
	Body      string `json:"body"`
	Signature string `json:"webhook_signature"`
}

func loadVectors(t *testing.T) []vector {
	t.Helper()
	data, err := os.ReadFile("testdata/webhooks.json")
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ Vectors []vector }
	if err := json.Unmarshal(data, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Vectors) == 0 {
		t.Fatal("no vectors")
	}
	return f.Vectors
}

func mustSecret(t *testing.T, s string) secrets.Secret {
	t.Helper()
	sec, err := secrets.ParseSecret(s)
	if err != nil {
		t.Fatal(err)
	}
	return sec
}

func TestVector(t *testing.T) {
	for _, v := range loadVectors(t) {
		ts, err := strconv.ParseInt(v.Timestamp, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Signature(v.ID, time.Unix(ts, 0), []byte(v.Body), []secrets.Secret{mustSecret(t, v.Secret)})
		if err != nil {
			t.Fatal(err)
		}
		if got != v.Signature {
			t.Errorf("signature %s, want %s", got, v.Signature)
		}
		// The official library verifies what SetHeaders produces.
		h := http.Header{}
		if err := SetHeaders(h, v.ID, time.Unix(ts, 0), []byte(v.Body), []secrets.Secret{mustSecret(t, v.Secret)}); err != nil {
			t.Fatal(err)
		}
		wh, err := standardwebhooks.NewWebhook(v.Secret)
		if err != nil {
			t.Fatal(err)
		}
		if err := wh.VerifyIgnoringTimestamp([]byte(v.Body), h); err != nil {
			t.Errorf("official library refuses: %v", err)
		}
		if err := wh.VerifyIgnoringTimestamp([]byte(v.Body+" "), h); err == nil {
			t.Error("official library accepts a changed body")
		}
	}
}

func TestHeadersAndRotation(t *testing.T) {
	oldS := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	newS := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32))
	other := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32))
	body := []byte(`{"payload":{"a":1},"signature":"x"}`)
	now := time.Now()
	h := http.Header{}
	if err := SetHeaders(h, "msg-1", now, body, []secrets.Secret{mustSecret(t, oldS), mustSecret(t, newS)}); err != nil {
		t.Fatal(err)
	}
	if h.Get("webhook-id") != "msg-1" || h.Get("Idempotency-Key") != "msg-1" || h.Get("Content-Type") != "application/json" ||
		h.Get("webhook-timestamp") != strconv.FormatInt(now.Unix(), 10) {
		t.Fatalf("headers: %v", h)
	}
	parts := strings.Split(h.Get("webhook-signature"), " ")
	if len(parts) != 2 || !strings.HasPrefix(parts[0], "v1,") || !strings.HasPrefix(parts[1], "v1,") || parts[0] == parts[1] {
		t.Fatalf("want two distinct v1 signatures, got %q", h.Get("webhook-signature"))
	}
	for _, s := range []string{oldS, newS} {
		wh, _ := standardwebhooks.NewWebhook(s)
		if err := wh.Verify(body, h); err != nil {
			t.Errorf("receiver holding one of the rotated secrets refuses: %v", err)
		}
	}
	wh, _ := standardwebhooks.NewWebhook(other)
	if err := wh.Verify(body, h); !errors.Is(err, standardwebhooks.ErrNoMatchingSignature) {
		t.Errorf("unrelated secret: %v, want ErrNoMatchingSignature", err)
	}
}

func TestEd25519(t *testing.T) {
	seed := bytes.Repeat([]byte{5}, 32)
	sk := mustSecret(t, "whsk_"+base64.StdEncoding.EncodeToString(seed))
	hm := mustSecret(t, "whsec_"+base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)))
	ts := time.Unix(1614265330, 0)
	body := []byte(`{"x":1}`)
	sig, err := Signature("msg_1", ts, body, []secrets.Secret{hm, sk})
	if err != nil {
		t.Fatal(err)
	}
	parts := strings.Split(sig, " ")
	if len(parts) != 2 || !strings.HasPrefix(parts[0], "v1,") || !strings.HasPrefix(parts[1], "v1a,") {
		t.Fatalf("signature %q", sig)
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(parts[1], "v1a,"))
	if err != nil {
		t.Fatal(err)
	}
	// Verified independently: Ed25519 over the Standard Webhooks content with
	// the public key published as whpk_.
	pub, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(sk.PublicKey(), "whpk_"))
	if err != nil {
		t.Fatal(err)
	}
	if !ed25519.Verify(pub, []byte("msg_1.1614265330."+string(body)), raw) {
		t.Error("v1a signature does not verify")
	}
	if ed25519.Verify(pub, []byte("msg_1.1614265331."+string(body)), raw) {
		t.Error("v1a signature verifies another timestamp")
	}
}

func TestNoSecret(t *testing.T) {
	h := http.Header{}
	if err := SetHeaders(h, "m", time.Now(), nil, nil); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("err = %v, want ErrNoSecret", err)
	}
	if len(h) != 0 {
		t.Fatalf("headers set without a secret: %v", h)
	}
}
