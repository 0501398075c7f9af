package signer

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/receiver"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
)

// TestReceiverVerifiesWhatTheWorkerSends: the receiver module accepts the
// headers this signer sets, v1 and v1a, alone and during a rotation, and
// what the official Standard Webhooks library signs; it refuses them under
// a secret it was not given.
func TestReceiverVerifiesWhatTheWorkerSends(t *testing.T) {
	envPriv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{5}, 32))
	at := time.Unix(1_800_000_000, 0)
	env, err := envelope.Sign(envelope.Draft{
		TenantID: "tenant-a", ProjectID: "proj-1", ProducerID: "svc-1", EventID: "ev-1", IdempotencyKey: "k-1",
		KeyID: "out-1", Sequence: 1, IssuedAt: at, Metadata: envelope.Metadata{Kind: "proposal"}, Payload: []byte(`{"a":1}`),
	}, envPriv)
	if err != nil {
		t.Fatal(err)
	}
	body := env.Canonical()
	keys, err := receiver.StaticKeys(map[string]string{"out-1": base64.RawURLEncoding.EncodeToString(envPriv.Public().(ed25519.PublicKey))})
	if err != nil {
		t.Fatal(err)
	}

	hmacText := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	oldText := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32))
	edText := "whsk_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{3}, 32))
	parse := func(s string) secrets.Secret {
		sec, err := secrets.ParseSecret(s)
		if err != nil {
			t.Fatal(err)
		}
		return sec
	}
	hm, old, ed := parse(hmacText), parse(oldText), parse(edText)

	official, err := standardwebhooks.NewWebhook(hmacText)
	if err != nil {
		t.Fatal(err)
	}
	officialSig, err := official.Sign("msg_official", at, body)
	if err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		name     string
		sign     func(h http.Header)
		verifyBy []string // the receiver's secrets
		ok       bool
	}{
		{"v1", func(h http.Header) { set(t, h, body, at, hm) }, []string{hmacText}, true},
		{"v1a", func(h http.Header) { set(t, h, body, at, ed) }, []string{ed.PublicKey()}, true},
		{"rotation, receiver has the new", func(h http.Header) { set(t, h, body, at, old, hm) }, []string{hmacText}, true},
		{"rotation, receiver has the old", func(h http.Header) { set(t, h, body, at, old, hm) }, []string{oldText}, true},
		{"v1 and v1a, receiver has v1a", func(h http.Header) { set(t, h, body, at, hm, ed) }, []string{ed.PublicKey()}, true},
		{"official library", func(h http.Header) {
			h.Set(HeaderID, "msg_official")
			h.Set(HeaderTimestamp, "1800000000")
			h.Set(HeaderSignature, officialSig)
		}, []string{hmacText}, true},
		{"v1, other secret", func(h http.Header) { set(t, h, body, at, hm) }, []string{oldText}, false},
		{"v1a, other key", func(h http.Header) { set(t, h, body, at, ed) }, []string{parse("whsk_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{4}, 32))).PublicKey()}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			v, err := receiver.New(receiver.Config{Secrets: c.verifyBy, Keys: keys, Tenant: "tenant-a", Now: func() time.Time { return at }})
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodPost, "/hook", bytes.NewReader(body))
			c.sign(r.Header)
			d, err := v.Verify(r)
			if c.ok {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if !bytes.Equal(d.Envelope.Canonical(), body) || d.WebhookID != r.Header.Get(HeaderID) {
					t.Fatalf("delivery %+v", d)
				}
				return
			}
			if e, ok := err.(*receiver.Error); !ok || e.Code != receiver.CodeBadSignature {
				t.Fatalf("want bad_signature, got %v", err)
			}
		})
	}
}

func set(t *testing.T, h http.Header, body []byte, at time.Time, secs ...secrets.Secret) {
	t.Helper()
	if err := SetHeaders(h, "msg_0123456789abcdef01234567", at, body, secs); err != nil {
		t.Fatal(err)
	}
}
