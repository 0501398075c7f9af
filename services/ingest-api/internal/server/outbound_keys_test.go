package server

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/receiver"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// TestOutboundKeys serves the current key first and the earlier public
// keys of the keys file after it, to service and operator credentials of
// the tenant only; a tenant without a key gets an empty list.
func TestOutboundKeys(t *testing.T) {
	o := newOutboxFixture(t)
	_, pubOld := newSeed(4)
	file := `{"` + tenantA + `":{"key_id":"` + outKeyID + `","seed":"` + base64.RawURLEncoding.EncodeToString(o.seed) +
		`","previous":[{"key_id":"out-0","public_key":"` + base64.RawURLEncoding.EncodeToString(pubOld) + `"}]}}`
	if err := os.WriteFile(o.keysPath, []byte(file), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := o.keys.Reload(); err != nil || !changed {
		t.Fatalf("reload: %v %v", changed, err)
	}
	want := receiver.OutboundKeys{Keys: []receiver.OutboundKey{
		{KeyID: outKeyID, PublicKey: base64.RawURLEncoding.EncodeToString(o.pub), Current: true},
		{KeyID: "out-0", PublicKey: base64.RawURLEncoding.EncodeToString(pubOld), Current: false},
	}}
	for _, tok := range []string{o.service, o.operator} {
		r := o.do(req{method: http.MethodGet, path: "/v1/outbound-keys", token: tok})
		if r.status != http.StatusOK {
			t.Fatalf("status %d %s", r.status, r.body)
		}
		var got receiver.OutboundKeys
		if err := json.Unmarshal(r.body, &got); err != nil {
			t.Fatal(err)
		}
		if len(got.Keys) != 2 || got.Keys[0] != want.Keys[0] || got.Keys[1] != want.Keys[1] {
			t.Fatalf("keys %s", r.body)
		}
	}
	if r := o.do(req{method: http.MethodGet, path: "/v1/outbound-keys", token: o.device}); r.status != http.StatusForbidden || r.answer(t).Reason != reasonForbidden {
		t.Fatalf("device: %d %s", r.status, r.body)
	}
	if r := o.do(req{method: http.MethodGet, path: "/v1/outbound-keys"}); r.status != http.StatusUnauthorized {
		t.Fatalf("no credential: %d %s", r.status, r.body)
	}
	other := o.issue("tenant-b", "acct-9", "svc-9", store.RoleService)
	if r := o.do(req{method: http.MethodGet, path: "/v1/outbound-keys", token: other}); r.status != http.StatusOK || string(r.body) != `{"keys":[]}` {
		t.Fatalf("tenant without a key: %d %s", r.status, r.body)
	}
}

type failingKeys struct{}

func (failingKeys) Key(context.Context, string) (string, ed25519.PrivateKey, error) {
	return "", nil, errors.New("key service unreachable")
}

func TestOutboundKeysUnavailable(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.OutboundKeys = failingKeys{} })
	r := f.do(req{method: http.MethodGet, path: "/v1/outbound-keys", token: f.service})
	if r.status != http.StatusServiceUnavailable || r.answer(t).Reason != reasonUnavailable {
		t.Fatalf("%d %s", r.status, r.body)
	}
}

// TestReceiverVerifiesOutboxEnvelopes: the receiver module, fetching this
// route, verifies an envelope POST /v1/outbox signed.
func TestReceiverVerifiesOutboxEnvelopes(t *testing.T) {
	o := newOutboxFixture(t)
	r := o.do(req{method: http.MethodPost, path: "/v1/outbox", token: o.service, body: outboxBody("k-rx", "n")})
	if r.status != http.StatusCreated {
		t.Fatalf("enqueue: %d %s", r.status, r.body)
	}
	var ans struct{ Envelope json.RawMessage }
	if err := json.Unmarshal(r.body, &ans); err != nil {
		t.Fatal(err)
	}
	env, err := envelope.Parse(ans.Envelope)
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(o.srv.Handler())
	defer api.Close()
	keys := receiver.NewRemoteKeys(api.URL, o.service, api.Client())
	pub, err := keys.PublicKey(context.Background(), env.KeyID)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Verify(pub); err != nil {
		t.Fatalf("outbox envelope does not verify under the served key: %v", err)
	}
}
