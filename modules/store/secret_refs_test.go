package store_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

func endpointWithRef(tenant, topic, ref string) store.Endpoint {
	return store.Endpoint{TenantID: tenant, ProjectID: "p1", Topic: topic, URL: "https://hooks.example.test/" + topic, SecretRef: ref}
}

// A secret ref belongs to the first tenant whose endpoint names it: that
// tenant may name it again, any other is refused (ErrSecretRefForeign,
// without the owner's id) and nothing of the refused endpoint is stored. A
// later change of an endpoint's ref obeys the same rule (the trigger covers
// UPDATE too), and a ref once owned stays owned when its endpoint moves on.
func TestSecretRefBelongsToOneTenant(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	first, err := f.s.Outbox().AddEndpoint(ctx, endpointWithRef("tenant-a", "x", "prod/hooks"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Outbox().AddEndpoint(ctx, endpointWithRef("tenant-a", "y", "prod/hooks")); err != nil {
		t.Fatalf("the owner naming its ref again: %v", err)
	}
	_, err = f.s.Outbox().AddEndpoint(ctx, endpointWithRef("tenant-b", "x", "prod/hooks"))
	wantErr(t, "another tenant's ref", err, store.ErrSecretRefForeign)
	if strings.Contains(err.Error(), "tenant-a") {
		t.Fatalf("the refusal names the owner: %q", err)
	}
	if n := f.count(`SELECT count(*) FROM endpoints WHERE tenant_id = 'tenant-b'`); n != 0 {
		t.Fatalf("%d endpoints stored for the refused tenant", n)
	}
	if n := f.count(`SELECT count(*) FROM secret_ref_owners WHERE secret_ref = 'prod/hooks' AND tenant_id = 'tenant-a'`); n != 1 {
		t.Fatal("owner row missing")
	}

	// An add refused for a taken endpoint id claims no ref.
	taken := endpointWithRef("tenant-a", "x", "a/never")
	taken.ID = "ep_0123456789abcdef01234567"
	if _, err := f.s.Outbox().AddEndpoint(ctx, taken); err != nil {
		t.Fatal(err)
	}
	taken.SecretRef = "a/unclaimed"
	_, err = f.s.Outbox().AddEndpoint(ctx, taken)
	wantErr(t, "taken id", err, store.ErrConflict)
	if _, err := f.s.Outbox().AddEndpoint(ctx, endpointWithRef("tenant-b", "w", "a/unclaimed")); err != nil {
		t.Fatalf("a ref named only by a refused add: %v", err)
	}

	// Updates, as the administrator (no store or envctl command changes a ref).
	var pg *pgconn.PgError
	b, err := f.s.Outbox().AddEndpoint(ctx, endpointWithRef("tenant-b", "x", "b/hooks"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.admin.ExecContext(ctx, `UPDATE endpoints SET secret_ref = 'prod/hooks' WHERE tenant_id = 'tenant-b' AND endpoint_id = $1`, b)
	if !errors.As(err, &pg) || pg.Code != "EW002" || strings.Contains(pg.Message, "tenant-a") {
		t.Fatalf("update to another tenant's ref: %v", err)
	}
	if _, err := f.admin.ExecContext(ctx, `UPDATE endpoints SET secret_ref = 'a/next' WHERE tenant_id = 'tenant-a' AND endpoint_id = $1`, first); err != nil {
		t.Fatalf("update to a new ref: %v", err)
	}
	_, err = f.s.Outbox().AddEndpoint(ctx, endpointWithRef("tenant-b", "z", "a/next"))
	wantErr(t, "a ref claimed by an update", err, store.ErrSecretRefForeign)
	_, err = f.s.Outbox().AddEndpoint(ctx, endpointWithRef("tenant-b", "z", "prod/hooks"))
	wantErr(t, "a ref whose endpoint moved on", err, store.ErrSecretRefForeign)
	// Updates that leave the ref alone do not consult owners.
	if err := f.s.Outbox().SetEndpointState(ctx, "tenant-a", first, store.EndpointDisabled, "operator"); err != nil {
		t.Fatal(err)
	}

	// Claim tells the worker whether the message's tenant owns the ref.
	_, err = f.admin.ExecContext(ctx, `UPDATE secret_ref_owners SET tenant_id = 'tenant-a' WHERE secret_ref = 'b/hooks'`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.Outbox().AddEndpoint(ctx, endpointWithRef("tenant-b", "x", "b2/hooks")); err != nil {
		t.Fatal(err)
	}
	o := out("k-1", `{}`)
	o.topic = "x"
	f.enqueue(actor("tenant-b", "svc1"), o)
	cs, err := f.s.Outbox().Claim(ctx, "tenant-b", 10, time.Minute)
	if err != nil || len(cs) != 2 {
		t.Fatalf("claim: %+v, %v", cs, err)
	}
	for _, c := range cs {
		if want := c.SecretRef == "b2/hooks"; c.SecretRefOwned != want {
			t.Fatalf("claimed %+v: owned %v, want %v", c, c.SecretRefOwned, want)
		}
	}
}

// Many tenants adding endpoints with the same new ref at once: exactly one
// tenant owns it, and every endpoint naming it is that tenant's.
func TestSecretRefConcurrentAdds(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	// Each goroutine on its own connection, so the inserts really race.
	s, err := store.Open(ctx, f.dsn, store.Options{MaxOpenConns: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const tenants, perTenant, rounds = 8, 2, 10
	for round := range rounds {
		ref := fmt.Sprintf("race/%d", round)
		start := make(chan struct{})
		var wg sync.WaitGroup
		errs := make([][]error, tenants)
		for i := range tenants {
			errs[i] = make([]error, perTenant)
			for j := range perTenant {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					_, errs[i][j] = s.Outbox().AddEndpoint(ctx, endpointWithRef(fmt.Sprintf("t%d", i), fmt.Sprintf("x%d", j), ref))
				}()
			}
		}
		close(start)
		wg.Wait()
		winners := 0
		for i := range tenants {
			ok := 0
			for _, err := range errs[i] {
				switch {
				case err == nil:
					ok++
				case !errors.Is(err, store.ErrSecretRefForeign):
					t.Fatalf("round %d, tenant %d: %v", round, i, err)
				}
			}
			if ok != 0 && ok != perTenant {
				t.Fatalf("round %d: tenant %d got %d of its %d endpoints", round, i, ok, perTenant)
			}
			if ok > 0 {
				winners++
			}
		}
		if winners != 1 {
			t.Fatalf("round %d: %d tenants own %s", round, winners, ref)
		}
		if n := f.count(`SELECT count(DISTINCT e.tenant_id) FROM endpoints e JOIN secret_ref_owners o
			ON o.secret_ref = e.secret_ref AND o.tenant_id = e.tenant_id WHERE e.secret_ref = $1`, ref); n != 1 {
			t.Fatalf("round %d: endpoints of %d owning tenants", round, n)
		}
		if n := f.count(`SELECT count(*) FROM endpoints WHERE secret_ref = $1`, ref); n != perTenant {
			t.Fatalf("round %d: %d endpoints name the ref, want %d", round, n, perTenant)
		}
	}
}
