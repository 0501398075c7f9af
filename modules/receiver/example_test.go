package receiver_test

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
	"github.com/envelopeworker/envelopeworker/modules/receiver"
)

// A webhook endpoint: the middleware verifies the Standard Webhooks headers
// and the envelope, and the handler sees only verified deliveries.
func Example() {
	// What the operator gives the consumer: the endpoint's whsec_ secret
	// and the tenant's outbound public keys (or a credential to fetch them
	// with receiver.NewRemoteKeys).
	secret := "whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	outbound := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, 32))
	keys, err := receiver.StaticKeys(map[string]string{
		"out-1": base64.RawURLEncoding.EncodeToString(outbound.Public().(ed25519.PublicKey)),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	v, err := receiver.New(receiver.Config{Secrets: []string{secret}, Keys: keys, Tenant: "tenant-a"})
	if err != nil {
		fmt.Println(err)
		return
	}
	srv := httptest.NewServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := receiver.FromContext(r.Context())
		fmt.Printf("%s: %s #%d %s\n", d.WebhookID, d.Envelope.Metadata.Kind, d.Envelope.Sequence, d.Envelope.Payload)
		w.WriteHeader(http.StatusNoContent)
	})))
	defer srv.Close()

	// What the delivery-worker sends.
	env, _ := envelope.Sign(envelope.Draft{
		TenantID: "tenant-a", ProjectID: "proj-1", ProducerID: "svc-1", EventID: "ev-1", IdempotencyKey: "k-1",
		KeyID: "out-1", Sequence: 1, IssuedAt: time.Now(), Metadata: envelope.Metadata{Kind: "proposal"},
		Payload: []byte(`{"task":42}`),
	}, outbound)
	send := func(body []byte) {
		ts := strconv.FormatInt(time.Now().Unix(), 10)
		mac := hmac.New(sha256.New, bytes.Repeat([]byte{1}, 32))
		mac.Write([]byte("msg_1." + ts + "."))
		mac.Write(env.Canonical()) // signed: the real envelope
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header.Set("webhook-id", "msg_1")
		req.Header.Set("webhook-timestamp", ts)
		req.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			fmt.Println(err)
			return
		}
		answer, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if len(answer) == 0 {
			fmt.Println(resp.StatusCode)
			return
		}
		fmt.Println(resp.StatusCode, string(answer))
	}
	send(env.Canonical())
	send(bytes.Replace(env.Canonical(), []byte("42"), []byte("43"), 1))
	// Output:
	// msg_1: proposal #1 {"task":42}
	// 204
	// 401 {"outcome":"refused","reason":"bad_signature"}
}
