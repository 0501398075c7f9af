package store

import (
	"flag"
	"os"
	"regexp"
	"strings"
	"testing"
)

var updatePgbench = flag.Bool("update-pgbench", false, "rewrite bench/ingest.pgbench from the store's SQL")

// pgbenchArgs stands in for Ingest's named arguments: per-client streams
// ('pgb-<run>-<client>'), sequences counted by :seq, a 1 KiB stored envelope.
var pgbenchArgs = map[string]string{
	"tenant":             `'bench'`,
	"project":            `'p1'`,
	"producer":           `('pgb-' || :run || '-' || :client_id)`,
	"event":              `sha256(convert_to('e-' || :run || '-' || :client_id || '-' || :seq, 'UTF8'))`,
	"idempotency_digest": `sha256(convert_to('i-' || :run || '-' || :client_id || '-' || :seq, 'UTF8'))`,
	"content_digest":     `sha256(convert_to('c-' || :run || '-' || :client_id || '-' || :seq, 'UTF8'))`,
	"sequence":           `:seq`,
	"key_id":             `'k1'`,
	"issued_at":          `now()`,
	"envelope":           `convert_to(repeat('x', 1024), 'UTF8')`,
	"expires_at":         `(now() + interval '90 days')`,
	"max_ahead":          `1024`,
	"account":            `'a1'`,
	"device":             `('pgb-' || :run || '-' || :client_id)`,
	"event_hex":          `encode(sha256(convert_to('e-' || :run || '-' || :client_id || '-' || :seq, 'UTF8')), 'hex')`,
	"correlation_id":     `'bench'`,
	"verified_with":      `NULL`,
}

// paramRE is a pgx named argument (pgx.NamedArgs' rule for a name).
var paramRE = regexp.MustCompile(`@[A-Za-z_][A-Za-z0-9_]*`)

// pgbenchSQL replaces each named argument of sql by its stand-in; one
// without a stand-in stays, and TestPgbenchScriptIsCurrent refuses it.
func pgbenchSQL(sql string) string {
	return strings.TrimSpace(paramRE.ReplaceAllStringFunc(sql, func(m string) string {
		if v, ok := pgbenchArgs[m[1:]]; ok {
			return v
		}
		return m
	}))
}

// pgbenchScript is the pgbench equivalent of one Ingest: BEGIN and the same two
// statements pipelined, then COMMIT, as the store sends them.
func pgbenchScript() string {
	return `-- Generated from modules/store's SQL by TestPgbenchScriptIsCurrent; do not edit.
-- Regenerate: go test -run TestPgbenchScriptIsCurrent -update-pgbench .
-- One transaction = one Ingest of a new in-order envelope on the client's own
-- stream. Run with -M prepared -D run=<unique> -D seq=0 (see bench/run.sh).
\set seq :seq + 1
\startpipeline
BEGIN;
` + pgbenchSQL(lockStreamSQL) + `;
` + pgbenchSQL(decideSQL) + `;
\endpipeline
COMMIT;
`
}

func TestPgbenchScriptIsCurrent(t *testing.T) {
	const path = "bench/ingest.pgbench"
	want := pgbenchScript()
	if *updatePgbench {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale: regenerate with -update-pgbench", path)
	}
	if strings.ContainsAny(want, "$@") {
		t.Fatal("a bind parameter has no pgbench stand-in")
	}
}
