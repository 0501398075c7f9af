package store_test

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is one test database with an admin handle for looking behind the API.
type fixture struct {
	t     testing.TB
	dsn   string
	s     *store.Store
	admin *sql.DB
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	dsn := storetest.NewDatabase(t)
	s := storetest.Open(t, dsn)
	return &fixture{t: t, dsn: dsn, s: s, admin: storetest.AdminDB(t, dsn)}
}

func (f *fixture) count(query string, args ...any) int {
	f.t.Helper()
	var n int
	if err := f.admin.QueryRow(query, args...).Scan(&n); err != nil {
		f.t.Fatalf("count %q: %v", query, err)
	}
	return n
}

// parameterACLs: the server grants settings one by one (GRANT SET ON
// PARAMETER, PostgreSQL 15 on), as migration 0004 needs.
func (f *fixture) parameterACLs() bool {
	return f.count(`SELECT (current_setting('server_version_num')::int >= 150000)::int`) == 1
}

func (f *fixture) tableCounts() [4]int {
	return [4]int{
		f.count(`SELECT count(*) FROM event_identities`),
		f.count(`SELECT count(*) FROM inbound_payloads`),
		f.count(`SELECT count(*) FROM audit_events`),
		f.count(`SELECT coalesce(sum(cursor), 0) FROM streams`),
	}
}

func (f *fixture) audit(tenant string) []store.AuditRecord {
	f.t.Helper()
	rs, err := f.s.Inbound().ListAudit(context.Background(), store.AuditFilter{TenantID: tenant, Limit: store.MaxAuditLimit})
	if err != nil {
		f.t.Fatalf("ListAudit: %v", err)
	}
	// oldest first reads better in assertions
	for i, j := 0, len(rs)-1; i < j; i, j = i+1, j-1 {
		rs[i], rs[j] = rs[j], rs[i]
	}
	return rs
}

func actor(tenant, device string) store.Actor {
	return store.Actor{TenantID: tenant, AccountID: "acct-" + device, DeviceID: device, CorrelationID: "corr-" + device}
}

// env describes a test envelope; input derives the contract's digests the way
// the envelope package would (identity and idempotency digest per contract §1;
// the content digest only has to differ when the content differs).
type env struct {
	tenant, project, producer, eventID, idemKey, content string
	seq                                                  int64
}

func (e env) identity() string {
	h := sha256.Sum256([]byte(e.tenant + "\n" + e.project + "\n" + e.eventID))
	return fmt.Sprintf("%x", h)
}

func (e env) input() store.IngestInput {
	idem := e.idemKey
	if idem == "" {
		idem = "idem-" + e.eventID
	}
	content := e.content
	if content == "" {
		content = "payload"
	}
	now := time.Now()
	return store.IngestInput{
		ProjectID:         e.project,
		ProducerID:        e.producer,
		EventIdentity:     e.identity(),
		KeyID:             "k1",
		IdempotencyDigest: sha256.Sum256([]byte(e.tenant + "\n" + e.project + "\n" + idem)),
		ContentDigest:     sha256.Sum256([]byte(fmt.Sprintf("%s|%s|%d|%s|%s", e.eventID, e.producer, e.seq, idem, content))),
		Sequence:          e.seq,
		IssuedAt:          now.Add(-time.Minute),
		Canonical:         []byte(fmt.Sprintf(`{"event_id":%q,"payload":%q,"sequence":%d}`, e.eventID, content, e.seq)),
		ExpiresAt:         now.Add(time.Hour),
	}
}

// ev is the common case: tenant t1, project p1, producer d1.
func ev(eventID string, seq int64) env {
	return env{tenant: "t1", project: "p1", producer: "d1", eventID: eventID, seq: seq}
}

func mustIngest(t testing.TB, s *store.Store, a store.Actor, in store.IngestInput) store.Result {
	t.Helper()
	r, err := s.Inbound().Ingest(context.Background(), a, in)
	if err != nil {
		t.Fatalf("Ingest(seq %d): %v", in.Sequence, err)
	}
	return r
}
