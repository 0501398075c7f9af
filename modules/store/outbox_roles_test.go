package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// outboxRefused must each fail with insufficient_privilege (42501): the
// outbox grants of 0002 give each role its transitions and nothing more.
var outboxRefused = map[string][]string{
	roleDelivery: {
		// nothing inbound, not even reads
		`SELECT FROM credentials`,
		`SELECT FROM producer_keys`,
		`SELECT FROM streams`,
		`SELECT FROM event_identities`,
		`SELECT FROM inbound_payloads`,
		`SELECT FROM audit_events`,
		`INSERT INTO audit_events (tenant_id, outcome) VALUES ('t', 'x')`,
		`UPDATE streams SET cursor = 0`,
		`DELETE FROM inbound_payloads`,
		// no enqueue, no budget or destination rewrites, no deletes
		`SELECT FROM outbound_streams`,
		`INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity, max_attempts, budget) VALUES ('t','m','p','x','e','\x00',1,1)`,
		`UPDATE outbox_messages SET max_attempts = 50`,
		`UPDATE outbox_messages SET budget = 50`,
		`UPDATE outbox_messages SET endpoint_id = 'e'`,
		`UPDATE outbox_messages SET replays = 0`,
		`DELETE FROM outbox_messages`,
		`INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref) VALUES ('t','e','p','x','https://x','s')`,
		`UPDATE endpoints SET url = 'https://attacker.example'`,
		`UPDATE endpoints SET secret_ref = 'other'`,
		`DELETE FROM endpoints`,
		`UPDATE outbound_envelopes SET envelope = '\x00'`,
		`INSERT INTO outbound_envelopes (tenant_id, event_identity, project_id, producer_id, sequence, topic, idempotency_digest, request_digest, envelope) VALUES ('t','\x00','p','d',1,'x','\x00','\x00','\x00')`,
		`DELETE FROM outbound_envelopes`,
		`TRUNCATE outbox_messages`,
		// sets a body's expiry, never the body, never deletes (0008)
		`UPDATE outbound_bodies SET envelope = '\x00'`,
		`DELETE FROM outbound_bodies`,
		`DELETE FROM outbox_attempts`,
		// reads secret ref owners, never writes them
		`INSERT INTO secret_ref_owners (secret_ref, tenant_id) VALUES ('r', 't')`,
		`UPDATE secret_ref_owners SET tenant_id = 't'`,
		`DELETE FROM secret_ref_owners`,
	},
	roleIngest: {
		`UPDATE outbox_messages SET attempts = 0`,
		`UPDATE outbox_messages SET last_error_code = ''`,
		`UPDATE outbox_messages SET endpoint_id = 'e'`,
		`DELETE FROM outbox_messages`,
		`UPDATE outbound_envelopes SET envelope = '\x00'`,
		`DELETE FROM outbound_envelopes`,
		`DELETE FROM outbound_streams`,
		`UPDATE outbound_bodies SET envelope = '\x00'`,
		`DELETE FROM outbound_bodies`,
		`INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref) VALUES ('t','e','p','x','https://x','s')`,
		`UPDATE endpoints SET state = 'active'`,
		`DELETE FROM endpoints`,
		// where webhooks go and what signs them stay out of ingest's reach (0005)
		`SELECT url FROM endpoints`,
		`SELECT secret_ref FROM endpoints`,
		`SELECT * FROM endpoints`,
		`SELECT FROM secret_ref_owners`,
	},
	roleOperator: {
		`INSERT INTO outbox_messages (tenant_id, message_id, project_id, topic, endpoint_id, event_identity, max_attempts, budget) VALUES ('t','m','p','x','e','\x00',1,1)`,
		`UPDATE outbox_messages SET attempts = 0`,
		`DELETE FROM outbox_messages`,
		`SELECT FROM outbound_envelopes`,
		`UPDATE outbound_envelopes SET envelope = '\x00'`,
		`DELETE FROM outbound_envelopes`,
		`SELECT FROM outbound_streams`,
		`DELETE FROM endpoints`,
		`UPDATE audit_events SET reason = ''`,
		`DELETE FROM audit_events`,
		// claims a ref only through the endpoints trigger; an owner never moves
		`INSERT INTO secret_ref_owners (secret_ref, tenant_id) VALUES ('r', 't')`,
		`UPDATE secret_ref_owners SET tenant_id = 't'`,
		`DELETE FROM secret_ref_owners`,
		// URL and secret ref may move (0010, endpoint update, through the owners
		// trigger); an endpoint's identity may not
		`UPDATE endpoints SET topic = 'other'`,
		`UPDATE endpoints SET tenant_id = 'other'`,
		`UPDATE endpoints SET project_id = 'other'`,
		// clears a body's expiry on replay; never reads or deletes a body (0008)
		`SELECT envelope FROM outbound_bodies`,
		`UPDATE outbound_bodies SET envelope = '\x00'`,
		`DELETE FROM outbound_bodies`,
	},
	roleJanitor: {
		`SELECT FROM endpoints`,
		// which messages are in flight, nothing of where or how they go (0008)
		`SELECT endpoint_id FROM outbox_messages`,
		`SELECT max_attempts FROM outbox_messages`,
		`SELECT FROM outbound_envelopes`,
		`SELECT FROM outbound_streams`,
		`DELETE FROM outbox_messages`,
		`UPDATE outbox_messages SET status = 'dead'`,
		`UPDATE outbound_bodies SET expires_at = NULL`,
		`INSERT INTO outbound_bodies (tenant_id, event_identity, envelope) VALUES ('t', '\x00', '\x00')`,
		`UPDATE outbox_attempts SET result = 'dead'`,
		`SELECT FROM outbound_unmoved_bodies`,
		`DELETE FROM outbound_envelopes`,
		`SELECT FROM secret_ref_owners`,
	},
}

func TestOutboxRolesAreRefusedWhatTheyMustNotDo(t *testing.T) {
	f := newFixture(t)
	for role, stmts := range outboxRefused {
		assertRefused(t, openRole(t, f.dsn, role), role, stmts)
	}
}

// Each binary's role can do its whole outbox job through the store.
func TestOutboxRolesCanDoTheirJob(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	operator := storetest.Open(t, storetest.DSNForRole(f.dsn, roleOperator))
	ingest := storetest.Open(t, storetest.DSNForRole(f.dsn, roleIngest))
	delivery := storetest.Open(t, storetest.DSNForRole(f.dsn, roleDelivery))

	gone, err := operator.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: "t1", ProjectID: "p1", Topic: "task.proposals",
		URL: "https://a.example/", SecretRef: "a"})
	if err != nil {
		t.Fatalf("operator add endpoint: %v", err)
	}
	other, err := operator.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: "t1", ProjectID: "p1", Topic: "task.proposals",
		URL: "https://b.example/", SecretRef: "b"})
	if err != nil {
		t.Fatalf("operator add endpoint: %v", err)
	}
	if err := operator.Outbox().SetEndpointState(ctx, "t1", other, store.EndpointDisabled, "operator"); err != nil {
		t.Fatalf("operator disable: %v", err)
	}
	if err := operator.Outbox().SetEndpointState(ctx, "t1", other, store.EndpointActive, ""); err != nil {
		t.Fatalf("operator enable: %v", err)
	}
	if _, err := operator.Outbox().GetEndpoint(ctx, "t1", other); err != nil {
		t.Fatalf("operator get endpoint: %v", err)
	}
	// The trigger claims refs in the operator's name and refuses another tenant's.
	if _, err := operator.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: "t2", ProjectID: "p1", Topic: "task.proposals",
		URL: "https://c.example/", SecretRef: "a"}); !errors.Is(err, store.ErrSecretRefForeign) {
		t.Fatalf("operator add endpoint with t1's ref for t2: %v", err)
	}

	o := out("k-1", `{}`)
	o.maxAttempts = 1
	r, err := ingest.Outbox().Enqueue(ctx, actor("t1", "svc1"), o.request())
	if err != nil || len(r.MessageIDs) != 2 {
		t.Fatalf("ingest enqueue: %+v, %v", r, err)
	}
	if r, err := ingest.Outbox().Enqueue(ctx, actor("t1", "svc1"), o.request()); err != nil || r.Created {
		t.Fatalf("ingest repeat: %+v, %v", r, err)
	}
	if _, err := ingest.Outbox().OutboxMessage(ctx, "t1", r.MessageIDs[0]); err != nil {
		t.Fatalf("ingest status: %v", err)
	}

	if tenants, err := delivery.Outbox().DueTenants(ctx, 10); err != nil || len(tenants) != 1 {
		t.Fatalf("delivery due tenants: %v, %v", tenants, err)
	}
	if _, err := delivery.Outbox().OutboxStats(ctx); err != nil {
		t.Fatalf("delivery stats: %v", err)
	}
	cs, err := delivery.Outbox().Claim(ctx, "t1", 10, time.Minute)
	if err != nil || len(cs) != 2 {
		t.Fatalf("delivery claim: %d, %v", len(cs), err)
	}
	var dead string
	for _, c := range cs {
		if !c.SecretRefOwned {
			t.Fatalf("delivery claim: %s's ref is its own, claim says not", c.EndpointID)
		}
		if _, err := delivery.Outbox().GetEndpoint(ctx, "t1", c.EndpointID); err != nil {
			t.Fatalf("delivery get endpoint: %v", err)
		}
		if c.EndpointID == gone {
			dead = c.MessageID
			if err := delivery.Outbox().MarkDead(ctx, "t1", c.MessageID, c.Attempt, store.CodeHTTP410, true); err != nil {
				t.Fatalf("delivery mark dead: %v", err)
			}
		} else if err := delivery.Outbox().MarkRetry(ctx, "t1", c.MessageID, c.Attempt, time.Now(), store.CodeHTTP5xx); err != nil {
			t.Fatalf("delivery mark retry: %v", err)
		}
	}
	if e, _ := operator.Outbox().GetEndpoint(ctx, "t1", gone); e.State != store.EndpointDisabled {
		t.Fatalf("410 by the delivery role did not disable: %+v", e)
	}

	dl, _, err := operator.Outbox().ListDeadLetters(ctx, "t1", "p1", 10, "")
	if err != nil || len(dl) != 2 {
		t.Fatalf("operator dead letters: %d, %v", len(dl), err)
	}
	if _, _, err := ingest.Outbox().ListDeadLetters(ctx, "t1", "p1", 10, ""); err != nil {
		t.Fatalf("ingest dead letters: %v", err)
	}
	if _, err := operator.Outbox().ReplayDeadLetter(ctx, actor("t1", "op1"), dead); err != nil {
		t.Fatalf("operator replay: %v", err)
	}
	var retried string
	for _, d := range dl {
		if d.MessageID != dead {
			retried = d.MessageID
		}
	}
	if _, err := ingest.Outbox().ReplayDeadLetter(ctx, actor("t1", "op2"), retried); err != nil {
		t.Fatalf("ingest replay: %v", err)
	}
	cs, err = delivery.Outbox().Claim(ctx, "t1", 10, time.Minute)
	if err != nil || len(cs) != 1 || cs[0].MessageID != retried {
		t.Fatalf("delivery claim after replay: %+v, %v", cs, err)
	}
	if err := delivery.Outbox().MarkDelivered(ctx, "t1", cs[0].MessageID, cs[0].Attempt); err != nil {
		t.Fatalf("delivery mark delivered: %v", err)
	}
	if rs, err := delivery.Outbox().SettleBatch(ctx, "t1", []store.Settlement{{MessageID: cs[0].MessageID,
		Attempt: cs[0].Attempt, Outcome: store.SettleDelivered}}); err != nil || !errors.Is(rs[0], store.ErrFenced) {
		t.Fatalf("delivery settle batch: %v, %v", rs, err)
	}
	if n := len(f.audit("t1")); n != 2 {
		t.Fatalf("%d replay audit rows, want 2", n)
	}
}
