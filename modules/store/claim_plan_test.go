package store_test

import (
	"context"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// The claim finds each message's endpoint and its secret ref's owner by
// primary key, whatever the statistics say and in the generic plan a pooled
// prepared statement ends up with: many refs, none analyzed yet (as right
// after migration 0005's backfill), must not turn the owner lookup into a
// scan of secret_ref_owners per claimed row.
func TestClaimPlanLooksUpEndpointAndOwnerByKey(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.addEndpoint("t1", "p1", "task.proposals")
	f.enqueue(actor("t1", "svc1"), out("k-1", `{}`))
	if _, err := f.admin.ExecContext(ctx, `
INSERT INTO endpoints (tenant_id, endpoint_id, project_id, topic, url, secret_ref)
SELECT 'other-' || g, 'ep_' || lpad(to_hex(g), 24, '0'), 'p1', 'x', 'https://hooks.example.test/', 'other-' || g
FROM generate_series(1, 20000) g`); err != nil {
		t.Fatal(err)
	}
	conn, err := f.admin.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, `PREPARE claim_plan (text, int, bigint, bigint) AS `+store.ClaimSQL); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		if _, err := conn.ExecContext(ctx, `SET plan_cache_mode = `+mode); err != nil {
			t.Fatal(err)
		}
		rows, err := conn.QueryContext(ctx, `EXPLAIN (COSTS OFF) EXECUTE claim_plan ('t1', 100, 60000000, 7776000000000)`)
		if err != nil {
			t.Fatal(err)
		}
		var plan strings.Builder
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan.WriteString(line + "\n")
		}
		rows.Close()
		p := plan.String()
		if strings.Contains(p, "Seq Scan on secret_ref_owners") || strings.Contains(p, "Seq Scan on endpoints") ||
			!strings.Contains(p, "Index Scan using secret_ref_owners_pkey") {
			t.Errorf("%s: the claim scans instead of looking up by key:\n%s", mode, p)
		}
	}
}
