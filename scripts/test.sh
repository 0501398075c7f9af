#!/usr/bin/env bash
# test.sh — every module's vet, race-enabled tests and a short fuzz pass, against a real PostgreSQL.
#
# `go test ./...` at a go.work root tests nothing useful, so this walks the workspace's modules.
#   FUZZTIME=30000x   how long each fuzz target runs, in executions (0 skips the fuzz pass). A count,
#                     not a duration: Go 1.26's coordinator can report a spurious "context deadline
#                     exceeded" failure when a -fuzztime duration ends (golang/go#75804, fixed in 1.27).
#   FUZZMINIMIZETIME=100x   how long each new corpus entry is minimized, in executions. Go's default is
#                     60 s per entry, which for a target doing a database round trip per execution
#                     (FuzzHTTP) costs far more than the executions themselves.
#   MODULES="modules/envelope services/ingest-api"   restrict to some modules
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
fuzztime=${FUZZTIME:-30000x}
minimizetime=${FUZZMINIMIZETIME:-100x}

eval "$(scripts/pg.sh)"
cleanup() { if [ "${PG_STARTED_BY_US:-0}" = 1 ]; then scripts/pg.sh stop; fi; }
trap cleanup EXIT
export TEST_DATABASE_URL
echo "PostgreSQL for tests: $(printf '%s' "$TEST_DATABASE_URL" | sed -E 's#://[^@]*@#://#')"

if [ -n "${MODULES:-}" ]; then
	dirs=$(for m in $MODULES; do echo "$root/$m"; done)
else
	dirs=$(go list -m -f '{{.Dir}}')
fi

failed=()
for dir in $dirs; do
	rel=${dir#"$root"/}
	echo "=== module $rel"
	(cd "$dir" && go vet ./...) || { failed+=("$rel (vet)"); continue; }
	# Each module builds without the workspace too, as a release and a Docker build see it.
	(cd "$dir" && GOWORK=off go build ./...) || { failed+=("$rel (GOWORK=off build)"); continue; }
	(cd "$dir" && go test -race -count=1 -timeout 15m ./...) || { failed+=("$rel (test)"); continue; }
	if [ "$fuzztime" != 0 ]; then
		for pkg in $(cd "$dir" && go list ./...); do
			targets=$(cd "$dir" && go test -list '^Fuzz' "$pkg" 2>/dev/null | grep '^Fuzz' || true)
			for t in $targets; do
				echo "--- fuzz $pkg $t ($fuzztime)"
				(cd "$dir" && go test -run '^$' -fuzz "^$t\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimizetime" "$pkg") ||
					failed+=("$rel ($t)")
			done
		done
	fi
done

if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAILED: %s\n' "${failed[@]}"
	exit 1
fi
echo "all modules passed"
