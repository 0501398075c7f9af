package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

func TestStoretestDatabases(t *testing.T) {
	ctx := context.Background()
	a, b := newFixture(t), newFixture(t)
	if a.dsn == b.dsn {
		t.Fatal("two tests share a database")
	}
	for _, f := range []*fixture{a, b} {
		if v, err := f.s.SchemaVersion(ctx); err != nil || v != migrations.Latest() {
			t.Fatalf("SchemaVersion = %d, %v; want %d", v, err, migrations.Latest())
		}
		if err := f.s.Ping(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mustIngest(t, a.s, actor("t1", "d1"), ev("e1", 1).input())
	if n := b.count(`SELECT count(*) FROM event_identities`); n != 0 {
		t.Fatalf("databases are not isolated: %d rows", n)
	}
	// AdminDB is a pool on the test's own database, beside the store's.
	var name string
	if err := a.admin.QueryRow(`SELECT current_database()`).Scan(&name); err != nil || a.dsn != storetest.WithDatabase(a.dsn, name) {
		t.Fatalf("AdminDB on %q (%v), want the database of %s", name, err, a.dsn)
	}
	if !strings.Contains(storetest.DSNForRole(a.dsn, "envelopeworker_janitor"), "envelopeworker_janitor@") {
		t.Fatal("DSNForRole did not set the user")
	}

	empty := storetest.Open(t, storetest.NewEmptyDatabase(t))
	if v, err := empty.SchemaVersion(ctx); err != nil || v != 0 {
		t.Fatalf("empty database: SchemaVersion = %d, %v; want 0", v, err)
	}
	if _, err := empty.Inbound().Stream(ctx, "t1", "p1", "d1"); !errors.Is(err, store.ErrInternal) {
		t.Fatalf("unmigrated database: %v, want ErrInternal", err)
	}
}
