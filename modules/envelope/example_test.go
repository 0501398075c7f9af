package envelope_test

import (
	"crypto/ed25519"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

func ExampleCanonicalize() {
	out, err := envelope.Canonicalize([]byte(`{"b": [1.50, 1e21, -0], "a": "\u00e9"}`))
	fmt.Println(string(out), err)

	_, err = envelope.Canonicalize([]byte(`{"a": 1, "a": 2}`))
	reason, _ := envelope.ReasonOf(err)
	fmt.Println(reason)
	// Output:
	// {"a":"é","b":[1.5,1e+21,0]} <nil>
	// invalid_envelope
}

func ExampleCanonicalizeWithLimits() {
	_, err := envelope.CanonicalizeWithLimits([]byte(`[[[]]]`), envelope.Limits{MaxDepth: 2})
	fmt.Println(err)
	// Output:
	// envelope: invalid_envelope: json: nesting deeper than 2
}

// The receiving side: step 2 (Parse), step 3 (Verify with the key found by
// key_id), step 4 (Validate), then the digests the store needs.
func ExampleParse() {
	body := []byte(`{"event_id":"evt-0001","idempotency_key":"idem-0001","issued_at":"2026-11-29T20:00:00Z","key_id":"k2026-11","metadata":{"kind":"task.status"},"payload":{"progress":0.5,"state":"running"},"producer_id":"device-7","project_id":"proj-1","schema_version":1,"sequence":1,"signature":"upRAnS8jagTRzHYMcTiIoaJW77yI4KorI7otwHoiGubZUYTeDMA6dRIRCDks1aJYyo6uAZol2a8jMTAIBK88BQ","tenant_id":"tenant-a"}`)
	pub, err := envelope.ParsePublicKey("4V3FeYheeZOgtKfwbWMNoBdxvZJkfhWuxvn6a39ezW8")
	if err != nil {
		fmt.Println(err)
		return
	}
	e, err := envelope.Parse(body)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(e.Verify(pub))
	fmt.Println(e.Validate(time.Date(2026, 11, 29, 20, 1, 0, 0, time.UTC), 0))
	fmt.Println(e.TenantID, e.Sequence, e.Metadata.Kind, string(e.Payload))
	fmt.Println(e.EventIdentity())
	d := e.ContentDigest()
	fmt.Println(hex.EncodeToString(d[:]))
	// Output:
	// <nil>
	// <nil>
	// tenant-a 1 task.status {"progress":0.5,"state":"running"}
	// 0aea46040a1f91f1f8881e308f6b0c36a5a6b40edda8a2903f8c947ce10b97c0
	// a632fa595e0ebfece5a5540a52f8352bffb1e64a35ba853777006f7c57a9a633
}

func ExampleEnvelope_Validate() {
	e, err := envelope.Parse([]byte(`{"event_id":"e1","idempotency_key":"i1","issued_at":"2026-11-29T20:00:00Z","key_id":"k1","metadata":{"kind":"x","priority":"high"},"payload":null,"producer_id":"d1","project_id":"p1","schema_version":1,"sequence":1,"signature":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA","tenant_id":"t1"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(e.Validate(time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC), 0))
	// Output:
	// envelope: invalid_metadata: metadata: unknown member
}

// The sending side (the outbox, load generators, tests): build, sign, store
// Canonical().
func ExampleSign() {
	seed, _ := hex.DecodeString("2883bf4b47b0e8c3d7c9b52f7584ab2ba8c8fc99c4cd65876417505575efd591")
	priv := ed25519.NewKeyFromSeed(seed)
	e, err := envelope.Sign(envelope.Draft{
		TenantID: "tenant-a", ProjectID: "proj-1", ProducerID: "device-7",
		EventID: "evt-0001", IdempotencyKey: "idem-0001", KeyID: "k2026-11", Sequence: 1,
		IssuedAt: time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC),
		Metadata: envelope.Metadata{Kind: "task.status"},
		Payload:  []byte(`{"state":"running","progress":0.5}`),
	}, priv)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(string(e.Canonical()))
	// Output:
	// {"event_id":"evt-0001","idempotency_key":"idem-0001","issued_at":"2026-11-29T20:00:00Z","key_id":"k2026-11","metadata":{"kind":"task.status"},"payload":{"progress":0.5,"state":"running"},"producer_id":"device-7","project_id":"proj-1","schema_version":1,"sequence":1,"signature":"upRAnS8jagTRzHYMcTiIoaJW77yI4KorI7otwHoiGubZUYTeDMA6dRIRCDks1aJYyo6uAZol2a8jMTAIBK88BQ","tenant_id":"tenant-a"}
}

func ExampleValidatePublicKey() {
	identity := make([]byte, 32)
	identity[0] = 1 // the neutral point: small order
	fmt.Println(envelope.ValidatePublicKey(identity))
	fmt.Println(envelope.ValidatePublicKey(make([]byte, 31)))
	// Output:
	// envelope: invalid public key: small-order point
	// envelope: invalid public key: want 32 bytes, have 31
}

func ExampleSplitBatch() {
	items, err := envelope.SplitBatch([]byte(`{"envelopes":[{"a":1}, 7]}`))
	fmt.Println(len(items), err)
	for _, it := range items {
		_, err := envelope.Parse(it)
		r, _ := envelope.ReasonOf(err)
		fmt.Printf("%s -> %s\n", it, r)
	}
	// Output:
	// 2 <nil>
	// {"a":1} -> invalid_envelope
	// 7 -> invalid_envelope
}

func ExampleEventIdentity() {
	fmt.Println(envelope.EventIdentity("tenant-a", "proj-1", "evt-0001"))
	// Output:
	// 0aea46040a1f91f1f8881e308f6b0c36a5a6b40edda8a2903f8c947ce10b97c0
}
