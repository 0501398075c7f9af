package store

import (
	"flag"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var updatePgbench = flag.Bool("update-pgbench", false, "rewrite bench/ingest.pgbench from the store's SQL")

// pgbenchArgs stands in for Ingest's bind parameters: per-client streams
// ('pgb-<run>-<client>'), sequences counted by :seq, a 1 KiB stored envelope.
var pgbenchArgs = map[int]string{
	1:  `'bench'`,
	2:  `'p1'`,
	3:  `('pgb-' || :run || '-' || :client_id)`,
	4:  `sha256(convert_to('e-' || :run || '-' || :client_id || '-' || :seq, 'UTF8'))`,
	5:  `sha256(convert_to('i-' || :run || '-' || :client_id || '-' || :seq, 'UTF8'))`,
	6:  `sha256(convert_to('c-' || :run || '-' || :client_id || '-' || :seq, 'UTF8'))`,
	7:  `:seq`,
	8:  `'k1'`,
	9:  `now()`,
	10: `convert_to(repeat('x', 1024), 'UTF8')`,
	11: `(now() + interval '90 days')`,
	12: `1024`,
	13: `'a1'`,
	14: `('pgb-' || :run || '-' || :client_id)`,
	15: `encode(sha256(convert_to('e-' || :run || '-' || :client_id || '-' || :seq, 'UTF8')), 'hex')`,
	16: `'bench'`,
	17: `NULL`,
}

var paramRE = regexp.MustCompile(`\$(\d+)`)

func pgbenchSQL(sql string) string {
	return strings.TrimSpace(paramRE.ReplaceAllStringFunc(sql, func(m string) string {
		n, _ := strconv.Atoi(m[1:])
		return pgbenchArgs[n]
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
	if strings.Contains(want, "$") {
		t.Fatal("a bind parameter has no pgbench stand-in")
	}
}
