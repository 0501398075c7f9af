package store_test

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// addEndpoint registers an active endpoint and returns its id.
func (f *fixture) addEndpoint(tenant, project, topic string) string {
	f.t.Helper()
	id, err := f.s.Outbox().AddEndpoint(context.Background(), store.Endpoint{
		TenantID: tenant, ProjectID: project, Topic: topic,
		URL: "https://hooks.example.test/" + topic, SecretRef: "sec-" + tenant + "-" + topic, // a secret ref belongs to one tenant
	})
	if err != nil {
		f.t.Fatalf("AddEndpoint: %v", err)
	}
	return id
}

// outReq is a test enqueue: the request digest derives from body, and Build
// makes a fresh event identity on every call (as the service's new event_id
// does) and counts its calls.
type outReq struct {
	project, producer, topic, key, body string
	maxAttempts                         int
	builds                              *atomic.Int64
}

func out(key, body string) outReq {
	return outReq{project: "p1", producer: "svc1", topic: "task.proposals", key: key, body: body,
		maxAttempts: 12, builds: new(atomic.Int64)}
}

func (o outReq) request() store.EnqueueRequest {
	return store.EnqueueRequest{
		ProjectID: o.project, ProducerID: o.producer, Topic: o.topic,
		IdempotencyDigest: sha256.Sum256([]byte(o.project + "\n" + o.key)),
		RequestDigest:     sha256.Sum256([]byte(o.body)),
		MaxAttempts:       o.maxAttempts,
		Build: func(seq int64) ([]byte, string, error) {
			o.builds.Add(1)
			nonce := make([]byte, 16)
			if _, err := rand.Read(nonce); err != nil {
				return nil, "", err
			}
			ident := sha256.Sum256(nonce)
			return []byte(fmt.Sprintf(`{"body":%q,"event_id":"%x","sequence":%d}`, o.body, nonce, seq)),
				hex.EncodeToString(ident[:]), nil
		},
	}
}

func (f *fixture) enqueue(a store.Actor, o outReq) store.EnqueueResult {
	f.t.Helper()
	r, err := f.s.Outbox().Enqueue(context.Background(), a, o.request())
	if err != nil {
		f.t.Fatalf("Enqueue(%s): %v", o.key, err)
	}
	return r
}

// seqOf reads the sequence Build embedded in a test envelope.
func seqOf(t testing.TB, envelope []byte) int64 {
	t.Helper()
	var e struct{ Sequence int64 }
	if err := json.Unmarshal(envelope, &e); err != nil || e.Sequence < 1 {
		t.Fatalf("envelope %q: sequence %d, %v", envelope, e.Sequence, err)
	}
	return e.Sequence
}

func (f *fixture) claim(tenant string, max int) []store.Claimed {
	f.t.Helper()
	cs, err := f.s.Outbox().Claim(context.Background(), tenant, max, 10*time.Minute)
	if err != nil {
		f.t.Fatalf("Claim: %v", err)
	}
	return cs
}

func (f *fixture) status(tenant, id string) store.MessageStatus {
	f.t.Helper()
	m, err := f.s.Outbox().OutboxMessage(context.Background(), tenant, id)
	if err != nil {
		f.t.Fatalf("OutboxMessage: %v", err)
	}
	return m
}

// expireLease makes a delivering message's lease run out, as time would.
func (f *fixture) expireLease(tenant, id string) {
	f.t.Helper()
	if _, err := f.admin.Exec(`UPDATE outbox_messages
		SET next_attempt_at = now() - interval '1 second', lease_expires_at = now() - interval '1 second'
		WHERE tenant_id = $1 AND message_id = $2 AND status = 'delivering'`, tenant, id); err != nil {
		f.t.Fatal(err)
	}
}

// messageRow is everything a settle could change, for "row unchanged" checks.
func (f *fixture) messageRow(tenant, id string) string {
	f.t.Helper()
	var row string
	if err := f.admin.QueryRow(`SELECT m::text FROM outbox_messages m WHERE tenant_id = $1 AND message_id = $2`,
		tenant, id).Scan(&row); err != nil {
		f.t.Fatal(err)
	}
	return row
}

// killAll claims every due message of tenant and marks it dead with code.
func (f *fixture) killAll(tenant, code string) []string {
	f.t.Helper()
	var ids []string
	for {
		cs := f.claim(tenant, store.MaxClaim)
		if len(cs) == 0 {
			return ids
		}
		for _, c := range cs {
			if err := f.s.Outbox().MarkDead(context.Background(), tenant, c.MessageID, c.Attempt, code, false); err != nil {
				f.t.Fatalf("MarkDead: %v", err)
			}
			ids = append(ids, c.MessageID)
		}
	}
}

func wantErr(t testing.TB, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", what, err, want)
	}
}
