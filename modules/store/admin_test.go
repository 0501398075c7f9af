package store_test

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// The admin listings and endpoint update run as envelopeworker_operator, the role envctl uses, so a
// column beyond its grants fails here (credential digests above all).
func operatorStore(t *testing.T, f *fixture) *store.Store {
	t.Helper()
	return storetest.Open(t, storetest.DSNForRole(f.dsn, "envelopeworker_operator"))
}

func TestAdminListingsPageInIDOrder(t *testing.T) {
	f := newFixture(t)
	ops := operatorStore(t, f)
	ctx := context.Background()
	var eps []string
	for i := 0; i < 5; i++ {
		id, err := ops.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: "t1", ProjectID: fmt.Sprintf("p%d", i%2), Topic: "x",
			URL: "https://h.example.test/", SecretRef: "ref-t1"})
		if err != nil {
			t.Fatal(err)
		}
		eps = append(eps, id)
	}
	if _, err := ops.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: "t2", ProjectID: "p0", Topic: "x", URL: "https://h.example.test/", SecretRef: "ref-t2"}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		pub, _, _ := ed25519.GenerateKey(rand.Reader)
		if err := ops.Credentials().AddKey(ctx, "t1", fmt.Sprintf("k%d", i), pub); err != nil {
			t.Fatal(err)
		}
		if _, _, err := ops.Credentials().IssueCredential(ctx, "t1", "a1", fmt.Sprintf("d%d", i), store.RoleDevice); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := ops.Credentials().IssueCredential(ctx, "t2", "a1", "d1", store.RoleDevice); err != nil {
		t.Fatal(err)
	}

	// pageAll reads every page of two and checks the ids come in strictly increasing order.
	pageAll := func(name string, list func(store.AdminPage) ([]string, error)) []string {
		t.Helper()
		var all []string
		p := store.AdminPage{TenantID: "t1", Limit: 2}
		for {
			ids, err := list(p)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			all = append(all, ids...)
			if len(ids) < p.Limit {
				break
			}
			p.After = ids[len(ids)-1]
		}
		for i := 1; i < len(all); i++ {
			if all[i-1] >= all[i] {
				t.Fatalf("%s: ids out of order: %v", name, all)
			}
		}
		return all
	}
	gotEps := pageAll("ListEndpoints", func(p store.AdminPage) ([]string, error) {
		es, err := ops.Outbox().ListEndpoints(ctx, p, "")
		var ids []string
		for _, e := range es {
			if e.TenantID != "t1" || e.URL == "" || e.SecretRef != "ref-t1" || e.State != store.EndpointActive || e.CreatedAt.IsZero() {
				t.Errorf("endpoint %+v", e)
			}
			ids = append(ids, e.ID)
		}
		return ids, err
	})
	if len(gotEps) != 5 {
		t.Fatalf("ListEndpoints paged %v, want %v", gotEps, eps)
	}
	if es, err := ops.Outbox().ListEndpoints(ctx, store.AdminPage{TenantID: "t1", Limit: 10}, "p1"); err != nil || len(es) != 2 {
		t.Fatalf("ListEndpoints of p1: %d, %v", len(es), err)
	}
	if ks := pageAll("ListKeys", func(p store.AdminPage) ([]string, error) {
		ks, err := ops.Credentials().ListKeys(ctx, p)
		var ids []string
		for _, k := range ks {
			if len(k.PublicKey) != ed25519.PublicKeySize || k.State != store.KeyActive {
				t.Errorf("key %+v", k)
			}
			ids = append(ids, k.KeyID)
		}
		return ids, err
	}); strings.Join(ks, ",") != "k0,k1,k2,k3,k4" {
		t.Fatalf("ListKeys paged %v", ks)
	}
	if cs := pageAll("ListCredentials", func(p store.AdminPage) ([]string, error) {
		cs, err := ops.Credentials().ListCredentials(ctx, p)
		var ids []string
		for _, c := range cs {
			if c.Status != store.CredentialActive || c.Role != store.RoleDevice || c.RevokedAt != nil || c.AccountID != "a1" {
				t.Errorf("credential %+v", c)
			}
			ids = append(ids, c.ID)
		}
		return ids, err
	}); len(cs) != 5 {
		t.Fatalf("ListCredentials paged %v", cs)
	}

	for _, p := range []store.AdminPage{
		{TenantID: "", Limit: 1}, {TenantID: "t 1", Limit: 1}, {TenantID: "t1", Limit: 0},
		{TenantID: "t1", Limit: store.MaxAdminPage + 1}, {TenantID: "t1", Limit: 1, After: strings.Repeat("x", 129)},
	} {
		if _, err := ops.Credentials().ListKeys(ctx, p); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ListKeys(%+v) = %v, want ErrInvalid", p, err)
		}
	}
	if _, err := ops.Outbox().ListEndpoints(ctx, store.AdminPage{TenantID: "t1", Limit: 1}, "p/1"); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("ListEndpoints of a bad project = %v", err)
	}
}

func TestUpdateEndpoint(t *testing.T) {
	f := newFixture(t)
	ops := operatorStore(t, f)
	ctx := context.Background()
	add := func(tenant, ref string) string {
		t.Helper()
		id, err := ops.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: tenant, ProjectID: "p1", Topic: "x", URL: "https://old.example.test/", SecretRef: ref})
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	id := add("t1", "ref-t1")
	add("t2", "ref-t2")
	if err := ops.Outbox().SetEndpointState(ctx, "t1", id, store.EndpointDisabled, "operator"); err != nil {
		t.Fatal(err)
	}
	if err := ops.Outbox().UpdateEndpoint(ctx, "t1", id, "https://new.example.test/hook", ""); err != nil {
		t.Fatal(err)
	}
	if err := ops.Outbox().UpdateEndpoint(ctx, "t1", id, "", "ref-t1-new"); err != nil {
		t.Fatal(err)
	}
	e, err := ops.Outbox().GetEndpoint(ctx, "t1", id)
	if err != nil {
		t.Fatal(err)
	}
	if e.URL != "https://new.example.test/hook" || e.SecretRef != "ref-t1-new" || e.State != store.EndpointDisabled || e.DisabledReason != "operator" {
		t.Fatalf("after update: %+v", e)
	}
	if n := f.count(`SELECT count(*) FROM secret_ref_owners WHERE secret_ref = 'ref-t1-new' AND tenant_id = 't1'`); n != 1 {
		t.Fatalf("the new ref was not claimed for t1 (%d)", n)
	}
	for _, c := range []struct {
		name                 string
		tenant, id, url, ref string
		want                 error
	}{
		{"another tenant's ref", "t1", id, "", "ref-t2", store.ErrSecretRefForeign},
		{"another tenant's endpoint", "t2", id, "https://x.example.test/", "", store.ErrNotFound},
		{"unknown id", "t1", "ep_000000000000000000000000", "https://x.example.test/", "", store.ErrNotFound},
		{"malformed id", "t1", "nope", "https://x.example.test/", "", store.ErrNotFound},
		{"nothing to change", "t1", id, "", "", store.ErrInvalid},
		{"plain http", "t1", id, "http://x.example.test/", "", store.ErrInvalid},
		{"user info", "t1", id, "https://u:p@x.example.test/", "", store.ErrInvalid},
		{"bad ref", "t1", id, "", "-ref", store.ErrInvalid},
		{"bad tenant", "t 1", id, "https://x.example.test/", "", store.ErrInvalid},
	} {
		if err := ops.Outbox().UpdateEndpoint(ctx, c.tenant, c.id, c.url, c.ref); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", c.name, err, c.want)
		}
	}
	if e2, _ := ops.Outbox().GetEndpoint(ctx, "t1", id); e2 != e {
		t.Fatalf("a refused update changed the endpoint: %+v", e2)
	}
}

func TestListAuditFilters(t *testing.T) {
	f := newFixture(t)
	ops := operatorStore(t, f)
	ctx := context.Background()
	base := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	for i, o := range []string{"accepted", "refused", "accepted", "replayed"} {
		if _, err := f.admin.Exec(`INSERT INTO audit_events (tenant_id, outcome, correlation_id, at) VALUES ('t1', $1, $2, $3)`,
			o, fmt.Sprint(i), base.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	corrs := func(fl store.AuditFilter) string {
		t.Helper()
		fl.TenantID = "t1"
		rs, err := ops.Inbound().ListAudit(ctx, fl)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rs {
			out = append(out, r.CorrelationID)
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		f    store.AuditFilter
		want string
	}{
		{store.AuditFilter{}, "3,2,1,0"},
		{store.AuditFilter{Outcome: "accepted"}, "2,0"},
		{store.AuditFilter{Since: base.Add(time.Minute)}, "3,2,1"},
		{store.AuditFilter{Until: base.Add(time.Minute)}, "0"},
		{store.AuditFilter{Since: base.Add(time.Minute), Until: base.Add(3 * time.Minute), Outcome: "accepted"}, "2"},
	} {
		if got := corrs(c.f); got != c.want {
			t.Errorf("ListAudit(%+v) = %s, want %s", c.f, got, c.want)
		}
	}
	for _, bad := range []store.AuditFilter{
		{TenantID: "t1", Outcome: "Accepted"},
		{TenantID: "t1", Since: base, Until: base},
	} {
		if _, err := ops.Inbound().ListAudit(ctx, bad); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("ListAudit(%+v) = %v, want ErrInvalid", bad, err)
		}
	}
}

// DeadLetterCursorAt starts a page at the first death at or after t, ties on dead_at included.
func TestDeadLetterCursorAt(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.fanOut("t1", 4, 4)
	ids := f.killAll("t1", store.CodeHTTP5xx)
	base := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	// Two died at base, two a microsecond later.
	slices.Sort(ids)
	for i, id := range ids {
		if _, err := f.admin.Exec(`UPDATE outbox_messages SET dead_at = $1 WHERE tenant_id = 't1' AND message_id = $2`,
			base.Add(time.Duration(i/2)*time.Microsecond), id); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		at   time.Time
		want []string
	}{
		{base.Add(-time.Hour), ids},
		{base, ids},
		{base.Add(500 * time.Nanosecond), ids}, // inside a microsecond: truncated, as dead_at is
		{base.Add(time.Microsecond), ids[2:]},
		{base.Add(2 * time.Microsecond), nil},
	} {
		dls, _, err := f.s.Outbox().ListDeadLetters(ctx, "t1", "p1", store.MaxDeadLetterPage, store.DeadLetterCursorAt(c.at))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, d := range dls {
			got = append(got, d.MessageID)
		}
		if strings.Join(got, ",") != strings.Join(c.want, ",") {
			t.Errorf("from %s: %v, want %v", c.at.Format(time.RFC3339Nano), got, c.want)
		}
	}
}
