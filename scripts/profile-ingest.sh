#!/usr/bin/env bash
# profile-ingest.sh — where ingest's time goes (issue 18): CPU profiles of ingest-api's handler and the
# statement time and CPU of PostgreSQL, for single envelopes and batches of 100 at 64 producers.
#
#   scripts/profile-ingest.sh
#   PROFILE_SINGLE=6400x      requests of BenchmarkIngestSingle/grouped (64 producers, group commit)
#   PROFILE_BATCH=320x        requests of BenchmarkIngestBatch (64 producers, 100 envelopes a request)
#   PROFILE_DIR=.tmp/profile-ingest   where the profiles and reports go (emptied first)
#
# It makes a throwaway PostgreSQL cluster (the machine's binaries, default settings, durable commits, as
# the benchmarks measure) that preloads pg_stat_statements, builds the ingest-api server package's test
# binary, warms it up once (the test template database is built then), and for each benchmark:
# resets pg_stat_statements, runs the benchmark with -test.cpuprofile, and writes
#   <name>.pprof              the test binary's CPU profile (go tool pprof -top <name>.pprof)
#   <name>-top.txt            its top functions, flat and cumulative, signing of the requests left out
#   <name>-statements.txt     pg_stat_statements of the run by total execution time
#   <name>-cpu.txt            CPU seconds of the test binary (handler, store client, and request signing
#                             before the timer) and of the cluster's processes (backends, WAL writer,
#                             checkpointer), from /proc, over the whole run
# The handler runs in process (httptest), so HTTP parsing over a socket and the load generator are not
# in the profile; bench-ingest.sh measures those end to end. Stops the cluster on exit.
set -euo pipefail
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

single=${PROFILE_SINGLE:-6400x}
batch=${PROFILE_BATCH:-320x}
out=${PROFILE_DIR:-$tmp/profile-ingest}
need psql "install the PostgreSQL client (Debian: postgresql-client)"
need go "install Go"

pgbin=""
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r) "$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/x)")"; do
	if [ -x "$d/initdb" ]; then pgbin=$d; break; fi
done
[ -n "$pgbin" ] || die "no PostgreSQL server binaries (initdb) found"
owner=$(id -un)
[ "$(id -u)" = 0 ] && { if id postgres >/dev/null 2>&1; then owner=postgres; else owner=nobody; fi; }
as_owner() { if [ "$(id -u)" = 0 ]; then runuser -u "$owner" -- "$@"; else "$@"; fi; }

rm -rf "$out"
mkdir -p "$out"
cluster=$(mktemp -d "${TMPDIR:-/tmp}/profile-ingest-pg.XXXXXX")
chmod 755 "$cluster"
[ "$(id -u)" = 0 ] && chown "$owner" "$cluster"
cleanup() {
	as_owner "$pgbin/pg_ctl" -D "$cluster/data" -m fast -w stop >/dev/null 2>&1 || true
	rm -rf "$cluster"
}
trap cleanup EXIT

port=$(free_port 55500)
log "throwaway PostgreSQL on 127.0.0.1:$port (durable, pg_stat_statements preloaded)"
as_owner "$pgbin/initdb" -D "$cluster/data" -U postgres --auth=trust --encoding=UTF8 >"$cluster/initdb.log" 2>&1 ||
	{ cat "$cluster/initdb.log" >&2; exit 1; }
cat >>"$cluster/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$cluster'
max_connections = 300
shared_preload_libraries = 'pg_stat_statements'
pg_stat_statements.max = 10000
CONF
as_owner "$pgbin/pg_ctl" -D "$cluster/data" -l "$cluster/server.log" -w -t 60 start >/dev/null ||
	{ cat "$cluster/server.log" >&2; exit 1; }
admin="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
psql "$admin" -XqAt -c 'CREATE EXTENSION pg_stat_statements' >/dev/null

# CPU ticks of the cluster: the postmaster, the children it reaped (cutime, cstime) and those alive.
clk=$(getconf CLK_TCK)
pg_ticks() {
	local pm total=0 pid
	pm=$(head -n 1 "$cluster/data/postmaster.pid")
	total=$(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat")
	for pid in $(ps -o pid= --ppid "$pm"); do
		[ -r "/proc/$pid/stat" ] || continue
		total=$((total + $(awk '{ print $14 + $15 }' "/proc/$pid/stat" 2>/dev/null || echo 0)))
	done
	echo "$total"
}

testbin="$out/server.test"
(cd "$root/services/ingest-api" && go test -c -o "$testbin" ./internal/server)
export TEST_DATABASE_URL=$admin
log "warm-up (builds the test template database)"
# The tests read testdata/ relative to their package.
cd "$root/services/ingest-api/internal/server"
"$testbin" -test.run '^$' -test.bench '^BenchmarkIngestBatch$' -test.benchtime 1x >"$out/warmup.txt" || { tail -n 30 "$out/warmup.txt" >&2; die "warm-up failed"; }

for spec in "single:^BenchmarkIngestSingle$/^grouped$:$single" "batch:^BenchmarkIngestBatch$:$batch"; do
	IFS=: read -r name pattern n <<<"$spec"
	psql "$admin" -XqAt -c 'SELECT pg_stat_statements_reset()' >/dev/null
	log "$name: $pattern, $n, load $(cut -d' ' -f1 /proc/loadavg)"
	p0=$(pg_ticks)
	start=$(date +%s.%N)
	# The test binary's own CPU: `times` prints the shell's, then its children's, user and system.
	( "$testbin" -test.run '^$' -test.bench "$pattern" -test.benchtime "$n" -test.cpuprofile "$out/$name.pprof" \
		>"$out/$name-bench.txt"; times >"$out/$name-times.txt" )
	wall=$(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }')
	p1=$(pg_ticks)
	go_cpu=$(sed -n 2p "$out/$name-times.txt" | awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.1f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
	{
		echo "wall ${wall}s, load $(cut -d' ' -f1-3 /proc/loadavg)"
		echo "test binary CPU ${go_cpu}s"
		awk -v t=$((p1 - p0)) -v c="$clk" 'BEGIN { printf "PostgreSQL cluster CPU %.1fs\n", t / c }'
		grep -E 'envelopes/s' "$out/$name-bench.txt" || true
	} >"$out/$name-cpu.txt"
	psql "$admin" -XAt -F ' | ' >"$out/$name-statements.txt" <<'SQL'
SELECT round(total_exec_time::numeric, 0) AS total_ms, calls, round(mean_exec_time::numeric, 3) AS mean_ms, rows,
       regexp_replace(left(query, 160), '\s+', ' ', 'g')
FROM pg_stat_statements ORDER BY total_exec_time DESC LIMIT 20
SQL
	{
		echo "== flat (request signing left out) =="
		go tool pprof -top -nodecount=30 -ignore 'signFor|signWith' "$testbin" "$out/$name.pprof" 2>/dev/null
		echo "== cumulative =="
		go tool pprof -top -cum -nodecount=40 -ignore 'signFor|signWith' "$testbin" "$out/$name.pprof" 2>/dev/null
	} >"$out/$name-top.txt"
	cat "$out/$name-cpu.txt"
done
log "profiles and reports in $out"
