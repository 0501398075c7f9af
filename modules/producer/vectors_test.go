package producer

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// testdata/envelopes.json is a verbatim copy of the contract's shared
// vectors (also in modules/envelope/testdata), made with an independent
// RFC 8785 implementation. testdata/jcs-expected.json was made by
// testdata/gen-jcs.js, a second independent one (Node.js), from
// testdata/jcs-cases.json; rerun it when the cases change. Both are
// checked in so the tests need nothing outside this module.

type sharedVectors struct {
	PrivateSeedHex string `json:"private_seed_hex"`
	Vectors        []struct {
		Name                 string `json:"name"`
		Body                 string `json:"body"`
		ExpectValidSignature bool   `json:"expect_valid_signature"`
		ExpectReason         string `json:"expect_reason"`
	} `json:"vectors"`
}

// TestProducerEnvelopesMatchTheSharedVectors rebuilds every valid vector
// from its members through the producer and requires the exact bytes the
// independent implementation wrote, signature included (Ed25519 is
// deterministic).
func TestProducerEnvelopesMatchTheSharedVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/envelopes.json")
	if err != nil {
		t.Fatal(err)
	}
	var vf sharedVectors
	if err := json.Unmarshal(raw, &vf); err != nil {
		t.Fatal(err)
	}
	seed, _ := hex.DecodeString(vf.PrivateSeedHex)
	checked := 0
	for _, v := range vf.Vectors {
		if !v.ExpectValidSignature || v.ExpectReason != "" {
			continue
		}
		e, err := envelope.Parse([]byte(v.Body))
		if err != nil {
			t.Fatalf("%s: %v", v.Name, err)
		}
		if string(e.Canonical()) != v.Body {
			continue // a vector about non-canonical input: not what a producer writes
		}
		signer, err := envelope.NewSigner(e.KeyID, ed25519.NewKeyFromSeed(seed))
		if err != nil {
			t.Fatal(err)
		}
		svc, srv := newFakeService(t, signer.PublicKey())
		store := &MemoryStore{}
		store.Save(context.Background(), State{Last: e.Sequence - 1})
		p, err := New(srv.URL, "tok", signer, WithStream(Stream{e.TenantID, e.ProjectID, e.ProducerID}),
			WithStore(store), WithClock(func() time.Time { return e.IssuedAt.Add(time.Minute) }))
		if err != nil {
			t.Fatal(err)
		}
		// Resume would move the sequence to the fake's cursor (0) plus one.
		p.loaded, p.synced = true, true
		p.state, _ = store.Load(context.Background())
		r, err := p.Send(context.Background(), Event{
			EventID: e.EventID, IdempotencyKey: e.IdempotencyKey, Metadata: e.Metadata,
			Payload: e.Payload, IssuedAt: e.IssuedAt,
		})
		if err != nil || !r.Delivered() {
			t.Fatalf("%s: %+v %v", v.Name, r, err)
		}
		if got := string(svc.bodies[0]); got != v.Body {
			t.Errorf("%s: producer sent\n%s\nvector is\n%s", v.Name, got, v.Body)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("no vector checked")
	}
	t.Logf("%d vectors rebuilt", checked)
}

func TestProducerEnvelopesMatchAnIndependentJCS(t *testing.T) {
	var cases []struct {
		EventID       string `json:"event_id"`
		Kind          string `json:"kind"`
		CorrelationID string `json:"correlation_id"`
		Traceparent   string `json:"traceparent"`
		Payload       string `json:"payload"`
	}
	var want []struct {
		EventID string `json:"event_id"`
		Body    string `json:"body"`
	}
	for file, dst := range map[string]any{"testdata/jcs-cases.json": &cases, "testdata/jcs-expected.json": &want} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			t.Fatal(err)
		}
	}
	if len(cases) == 0 || len(cases) != len(want) {
		t.Fatalf("%d cases, %d expectations", len(cases), len(want))
	}
	issued := time.Date(2026, 11, 29, 20, 0, 0, 123_000_000, time.UTC)
	svc, srv := newFakeService(t, testSigner(t).PublicKey())
	p := newTestProducer(t, srv.URL, &MemoryStore{}, WithClock(func() time.Time { return issued }))
	for i, c := range cases {
		r, err := p.Send(context.Background(), Event{
			EventID:  c.EventID,
			Metadata: envelope.Metadata{Kind: c.Kind, CorrelationID: c.CorrelationID, Traceparent: c.Traceparent},
			Payload:  []byte(c.Payload),
		})
		if err != nil || !r.Delivered() {
			t.Fatalf("%s: %+v %v", c.EventID, r, err)
		}
		if got := string(svc.bodies[i]); got != want[i].Body {
			t.Errorf("%s: producer sent\n%s\nnode made\n%s", c.EventID, got, want[i].Body)
		}
	}
}
