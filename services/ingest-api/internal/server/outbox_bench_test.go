package server

import (
	"crypto/ed25519"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// BenchmarkOutboxBuild is what one enqueue's Build costs inside the outbox
// transaction: making and signing the outbound envelope of a ~600-byte
// payload, once its sequence is known. A group of n holds its stream locks
// (and the committer's deciding turn) for n of these.
func BenchmarkOutboxBuild(b *testing.B) {
	body := []byte(`{"project_id":"proj-1","topic":"task.proposals","idempotency_key":"k-1","kind":"proposal","payload":{"pad":"` +
		strings.Repeat("x", 600) + `"}}`)
	r, jcs, _, ok := parseOutboxRequest(body)
	if !ok {
		b.Fatal("body does not parse")
	}
	sg := outboxSigner{keyID: "out-1", priv: ed25519.NewKeyFromSeed(make([]byte, 32))}
	item := enqueueItem(store.Actor{TenantID: tenantA, AccountID: "acct-1", DeviceID: "svc-1"}, "svc-1", r, jcs, sg, testNow)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, _, err := item.Request.Build(int64(i + 1)); err != nil {
			b.Fatal(err)
		}
	}
}
