#!/usr/bin/env bash
# test.sh — every workspace module's vet and tests (race-enabled where goroutines share state), against
# a real PostgreSQL, and with FUZZTIME set a fuzz pass. `make test` and CI (.ci/run) call it without
# fuzzing (every fuzz target's seed corpus still runs as an ordinary test); `make fuzz` sets FUZZTIME.
#
# `go test ./...` at a go.work root tests nothing (the root is no module), but one `go test` given every
# module's `./module/...` pattern builds and runs them all as one job graph: the two cores stay busy
# across modules instead of waiting for the slowest package of each module in turn. The modules come
# from go.work, so a new module is tested as soon as it is added there.
#
# Which packages run under -race is decided from their source, not from a list. The race detector can
# only report a race between goroutines that actually ran, so a package earns -race when its code or
# tests start goroutines: a go statement, t.Parallel, sync/atomic or golang.org/x/sync, an httptest
# server (handlers run on its goroutines), os/exec (goroutines copy the child's output), or "sync" in
# its tests. A package with none of these (pure parsing, config, signing) runs without -race: under it
# the detector has nothing to watch, and the run costs several times as long (modules/envelope: 50 s
# against a few). Its code is still race-checked wherever a race-tested package calls it
# concurrently, since -race instruments every package linked into a test binary. The split is printed
# on every run.
#
#   FUZZTIME=10000x   how long each fuzz target runs after the tests, as a count of executions or a
#                     duration; unset or 0 (`make test`) skips the fuzz pass. Prefer a count to a
#                     duration: Go 1.26's coordinator can report a spurious "context deadline
#                     exceeded" failure when a -fuzztime duration ends (golang/go#75804, fixed in 1.27).
#   FUZZMINIMIZETIME=100x   how long each new corpus entry is minimized, in executions. Go's default is
#                     60 s per entry, which for a target doing a database round trip per execution
#                     (FuzzHTTP) costs far more than the executions themselves.
#   MODULES="modules/envelope services/ingest-api"   restrict to some modules
#   TEST_P=<cores>    how many test binaries build and run at once (go test -p). The default, one per
#                     core, is the parallelism each module's tests had when modules ran one after
#                     another: tests that time a peer (a hanging endpoint, a slow client) keep the CPU
#                     they were written for. More may finish sooner on an idle machine.
#   TEST_LAYOUTS=plain  skip the second run of the store, janitor and end-to-end subset on the partitioned layout
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
# No fuzz pass by default: a short one mostly pays for instrumented builds of each target's package
# (FuzzHTTP also a database round trip per execution) and finds little; the seed corpora run as tests
# anyway. `make fuzz` is the long run, and CI's per-module jobs fuzz every target 200000 times.
fuzztime=${FUZZTIME:-0}
minimizetime=${FUZZMINIMIZETIME:-100x}
parallel=${TEST_P:-$(nproc 2>/dev/null || echo 2)}
started=$SECONDS

# A PostgreSQL cluster of the run's own (fsync off, nobody else's checkpoints) unless TEST_DATABASE_URL
# names one or no server binaries are installed: see PG_THROWAWAY=prefer in scripts/pg.sh.
eval "$(PG_THROWAWAY=${PG_THROWAWAY:-prefer} scripts/pg.sh)"
# The commands tests run as processes (the services, envctl) are built once for the whole run, by the
# first test process that needs each, into this directory (buildtest.DirEnv in modules/buildinfo).
ENVELOPEWORKER_TEST_BIN=$(mktemp -d)
export ENVELOPEWORKER_TEST_BIN
cleanup() {
	# The partitioned pass runs in the background (below): it must not outlive an interrupted run.
	if [ -n "${part_pid:-}" ]; then pkill -P "$part_pid" 2>/dev/null || true; fi
	rm -rf "$ENVELOPEWORKER_TEST_BIN"
	if [ "${PG_STARTED_BY_US:-0}" = 1 ]; then scripts/pg.sh stop; fi
}
trap cleanup EXIT
export TEST_DATABASE_URL
echo "PostgreSQL for tests: $(printf '%s' "$TEST_DATABASE_URL" | sed -E 's#://[^@]*@#://#')"

if [ -n "${MODULES:-}" ]; then
	dirs=$(for m in $MODULES; do echo "$root/$m"; done)
else
	dirs=$(go list -m -f '{{.Dir}}')
fi
patterns=()
for dir in $dirs; do patterns+=("./${dir#"$root"/}/..."); done

step() { printf '=== %s (%ds)\n' "$*" $((SECONDS - started)); }
failed=()

step "go vet: ${patterns[*]}"
go vet "${patterns[@]}" || failed+=("vet")

# Each module resolves without the workspace too, as a release and a Docker build see it: a missing
# require or go.sum line, for its code or its tests, fails here. Loading the package graph finds those
# without compiling each module a second time at its own dependency versions (which differ from the
# workspace's, so nothing of the workspace build is reused); CI's per-module jobs and the release
# workflow build and test each module with GOWORK=off.
step "resolve each module with GOWORK=off"
for dir in $dirs; do
	(cd "$dir" && GOWORK=off go list -deps -test ./... >/dev/null) || failed+=("${dir#"$root"/} (GOWORK=off)")
done

# One line per package with tests: import path, directory, its code files, its test files.
race_pkgs=() plain_pkgs=() fuzz=()
concurrent='^[[:space:]]*go (func|[A-Za-z_][A-Za-z0-9_.]*\()|\.Parallel\(\)|"sync/atomic"|"golang\.org/x/sync/|"net/http/httptest"|"os/exec"'
while IFS=$'\t' read -r pkg dir code tests; do
	# shellcheck disable=SC2086 # space-separated lists of plain file names
	if (cd "$dir" && grep -qE "$concurrent" $code $tests) || (cd "$dir" && grep -q '"sync"' $tests); then
		race_pkgs+=("$pkg")
	else
		plain_pkgs+=("$pkg")
	fi
	# shellcheck disable=SC2086
	for t in $(cd "$dir" && sed -n -E 's/^func (Fuzz[A-Za-z0-9_]*)\(.*/\1/p' $tests); do fuzz+=("$pkg $t"); done
done < <(go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{"\t"}}{{.Dir}}{{"\t"}}{{join .GoFiles " "}}{{"\t"}}{{join .TestGoFiles " "}} {{join .XTestGoFiles " "}}{{end}}' "${patterns[@]}")

# The fault-injection run (a PostgreSQL cluster of its own, fresh builds of the three binaries, 45 s of
# faults at the least) is a target of its own, like the fuzz and soak runs: `make chaos`; CI's job for
# the tools module runs it too (go test ./... there). The harness's other tests (the checker, the
# janitor across a PostgreSQL crash) stay here.
long_tests='^TestChaos$'
echo "left to make chaos: $long_tests"

# The partitioned layout (migrations/layout.go) once more: the store, the janitor, and the end-to-end
# tests of ingest, batch, outbox claim/settle, replay and retention. TEST_LAYOUTS=plain skips it.
# It runs beside the plain-layout passes, not after them: the tests mostly wait on PostgreSQL (creating
# and dropping databases, leases, timeouts), so two cores are far from busy with one pass alone, and
# each test has a database of its own. Its packages are compiled first (running no test), so the two
# passes do not compile the same test binaries at once; its output is printed when it ends.
part_pid=""
if [ "${TEST_LAYOUTS:-plain partitioned}" != plain ] && [ -z "${MODULES:-}" ]; then
	part_pkgs=(./modules/store ./services/retention-janitor/... ./tools/internal/e2e)
	step "compile the partitioned layout's packages"
	go test -race -count=1 -run '^$' "${part_pkgs[@]}" >/dev/null || failed+=("partitioned layout (build)")
	step "go test -race, partitioned layout: store, janitor, end-to-end subset (beside the passes below)"
	# The store's tests whose SQL does not touch a partitioned table (credentials, keys, endpoints,
	# readiness, settings, the storetest helpers) run once, on the plain layout; so do the plan tests
	# that make their own partitioned database in every run (one partition a statement; plans with
	# and without the parents' statistics).
	plain_only='^Test(Credential|MalformedToken|IssueCredential|KeyLifecycle|AddKeyRefusesWeakKeys|PruneKeys|ProducerKeyGuard|SignedBy|VerifiedWithKeyCheck|Endpoint|UpdateEndpoint|AdminListings|SecretRef|Readiness|CheckSchema|WALCompression|AsyncCommit|Storetest|PgbenchScript|CursorAgainstModel|StatementTimeout|UnavailableDatabase|ClosedStore|SchemaMismatch|HotStatementsTouchOnePartition|UnanalyzedParentsPlanAsAnalyzed)'
	part_log="$ENVELOPEWORKER_TEST_BIN/partitioned.log"
	(
		rc=0
		TEST_LAYOUT=partitioned go test -race -count=1 -p "$parallel" -timeout 15m -skip "$plain_only" ./modules/store ./services/retention-janitor/... || rc=1
		TEST_LAYOUT=partitioned go test -race -count=1 -timeout 15m ./tools/internal/e2e \
			-run '^(TestToolsAgainstIngestAPI|TestAdminSurfaceThroughTheBinary|TestAttemptHistoryEndToEnd|TestOutboundRetentionEndToEnd)$' || rc=1
		exit $rc
	) >"$part_log" 2>&1 &
	part_pid=$!
fi

short() { local p; for p in "$@"; do printf ' %s' "${p#github.com/envelopeworker/envelopeworker/}"; done; }
if [ ${#race_pkgs[@]} -gt 0 ]; then
	step "go test -race, ${#race_pkgs[@]} packages with goroutines or shared state:$(short "${race_pkgs[@]}")"
	go test -race -count=1 -p "$parallel" -timeout 15m -skip "$long_tests" "${race_pkgs[@]}" || failed+=("test -race")
fi
if [ ${#plain_pkgs[@]} -gt 0 ]; then
	step "go test, ${#plain_pkgs[@]} packages without concurrency:$(short "${plain_pkgs[@]}")"
	go test -count=1 -p "$parallel" -timeout 15m "${plain_pkgs[@]}" || failed+=("test")
fi


if [ -n "$part_pid" ]; then
	wait "$part_pid" || failed+=("partitioned layout")
	step "partitioned layout finished; its output:"
	cat "$part_log"
fi

if [ "$fuzztime" != 0 ]; then
	for f in "${fuzz[@]}"; do
		read -r pkg t <<<"$f"
		step "fuzz $pkg $t ($fuzztime)"
		go test -run '^$' -fuzz "^$t\$" -fuzztime "$fuzztime" -fuzzminimizetime "$minimizetime" "$pkg" ||
			failed+=("$pkg ($t)")
	done
fi

step "done"
if [ ${#failed[@]} -gt 0 ]; then
	printf 'FAILED: %s\n' "${failed[@]}"
	exit 1
fi
echo "all modules passed"
