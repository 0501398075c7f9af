#!/usr/bin/env bash
# bench-janitor.sh — retention-janitor delete throughput over a backlog of expired payloads, and what a
# janitor run does to the latency of ingest running at the same time (issue 6: ingest p99 should rise by
# less than 25 %). Prints a table.
#
#   scripts/bench-janitor.sh
#   BENCH_ROUNDS=3              rounds; each runs (a) ingest alone and (j0, j1, ...) ingest beside a
#                               janitor run of each variant, the order rotated every round so drift in the
#                               machine's load hits all of them
#   BENCH_SECONDS=15            length of each ingest run
#   BENCH_RATE=400              fixed total ingest rate, envelopes/s (about half of what a 2 vCPU VM
#                               sustains on the single route: a latency test, not a throughput test)
#   BENCH_PRODUCERS=16          concurrent producers, single route, one request in flight each
#   BENCH_PAYLOAD_BYTES=600     padding per ingested payload (about 1 KiB signed envelopes)
#   BENCH_JANITOR_ROWS=100000   rows seeded before every measured run: expired before a janitor run, live before ingest alone
#   BENCH_JANITOR_ENVELOPE_BYTES=1000   size of each seeded envelope
#   BENCH_JANITOR_DELAY=1       seconds between ingest's first request and the janitor's start
#   BENCH_JANITOR_BATCH=        the janitor's JANITOR_BATCH_SIZE (1-1000; unset: its default)
#   BENCH_JANITOR_RATE=         the janitor's JANITOR_MAX_ROWS_PER_SECOND (unset: its default; 0: no cap)
#   BENCH_JANITOR_WAL_COMPRESSION=  the janitor's JANITOR_WAL_COMPRESSION (unset: its default)
#   BENCH_JANITOR_VARIANTS=     instead of the three above: janitor settings to compare in the same run,
#                               space-separated variants of comma-separated NAME=VALUE, e.g.
#                               "JANITOR_WAL_COMPRESSION=off JANITOR_WAL_COMPRESSION=lz4"; every round
#                               then runs ingest alone and once beside each variant, in rotating order
#   BENCH_KEEP_DB=1             keep the envelopeworker_bench_janitor database (dropped by default)
#
# It ensures PostgreSQL (scripts/pg.sh), makes a fresh database envelopeworker_bench_janitor, migrates it,
# builds the binaries, starts ingest-api on a free loopback port with limiters opened wide (as
# bench-ingest.sh), sets up producers with loadgen-ingest, and before every measured run seeds the same
# number of rows as the admin with set-based SQL (expired ones before a janitor run, live ones before
# ingest alone; identities, payloads, their stream and key; VACUUM ANALYZE and CHECKPOINT outside every
# measurement). In (j) the retention-janitor binary runs once, as envelopeworker_janitor
# when the server lets that role in (else the admin DSN), started once ingest's first request is seen;
# its summary line gives rows deleted and duration. Ingest payloads expire in the future, so the janitor
# deletes only the seeded rows. A 5 s warm-up run goes first, unrecorded. The table gives each run's
# latency, the WAL the server wrote during it, the buffers backends wrote and read, and the machine's CPU; the verdict is the median of the per-round p99 ratios
# (a neighbour's burst of load swings single runs 2-5x on a shared machine). Everything stops (ingest-api, a running load generator or janitor, a
# throwaway cluster pg.sh started) and the database is dropped on exit. Every wait is bounded.
set -euo pipefail
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

rounds=${BENCH_ROUNDS:-3}
seconds=${BENCH_SECONDS:-15}
rate=${BENCH_RATE:-400}
producers=${BENCH_PRODUCERS:-16}
payload=${BENCH_PAYLOAD_BYTES:-600}
jrows=${BENCH_JANITOR_ROWS:-100000}
jbytes=${BENCH_JANITOR_ENVELOPE_BYTES:-1000}
jdelay=${BENCH_JANITOR_DELAY:-1}
# Unset janitor settings are left to the janitor's own defaults, so the figures are the shipped ones.
jbatch=${BENCH_JANITOR_BATCH-}
jrate=${BENCH_JANITOR_RATE-}
jwal=${BENCH_JANITOR_WAL_COMPRESSION-}
for v in jbatch jrate; do
	case "${!v}" in *[!0-9]*) die "$v must be a whole number (got '${!v}')" ;; esac
done
# variants: one janitor configuration each, as comma-separated NAME=VALUE (empty: the janitor's defaults).
variants=()
if [ -n "${BENCH_JANITOR_VARIANTS:-}" ]; then
	[ -z "$jbatch$jrate$jwal" ] || die "set either BENCH_JANITOR_VARIANTS or BENCH_JANITOR_BATCH/RATE/WAL_COMPRESSION"
	read -r -a variants <<<"$BENCH_JANITOR_VARIANTS"
	for v in "${variants[@]}"; do
		IFS=, read -r -a kvs <<<"$v"
		for kv in "${kvs[@]}"; do
			case "$kv" in
			JANITOR_TIMEOUT=?* | JANITOR_BATCH_SIZE=?* | JANITOR_MAX_ROWS_PER_SECOND=?* | JANITOR_WAL_COMPRESSION=?*) ;;
			*) die "variant setting '$kv' is not one of the janitor's JANITOR_TIMEOUT, JANITOR_BATCH_SIZE, JANITOR_MAX_ROWS_PER_SECOND, JANITOR_WAL_COMPRESSION=value" ;;
			esac
		done
	done
else
	v=""
	if [ -n "$jbatch" ]; then v+="JANITOR_BATCH_SIZE=$jbatch,"; fi
	if [ -n "$jrate" ]; then v+="JANITOR_MAX_ROWS_PER_SECOND=$jrate,"; fi
	if [ -n "$jwal" ]; then v+="JANITOR_WAL_COMPRESSION=$jwal,"; fi
	variants=("${v%,}")
fi
for v in rounds seconds rate producers payload jrows jbytes jdelay; do
	case "${!v}" in '' | *[!0-9]*) die "$v must be a whole number (got '${!v}')" ;; esac
done
[ "$rounds" -ge 1 ] && [ "$seconds" -ge 1 ] && [ "$rate" -ge 1 ] && [ "$producers" -ge 1 ] && [ "$jrows" -ge 1 ] ||
	die "rounds, seconds, rate, producers and janitor rows must be at least 1"
need timeout "install coreutils"
bench_init bench-janitor
loadgen_pid=""
janitor_pid=""
db=envelopeworker_bench_janitor
cleanup() {
	# Our own children, by pid, if a failure left one running.
	for p in $loadgen_pid $janitor_pid; do kill -TERM "$p" 2>/dev/null || true; done
	stop_pidfile "$pidfile" ingest-api
	rm -f "$work/creds.json" # tokens and seeds of producers whose database is about to go
	release_pg "$db" "${BENCH_KEEP_DB:-0}"
}
trap cleanup EXIT

loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }
now() { date +%s.%N; }
load_start=$(loadavg)

use_fresh_db "$db"
build_bins
log "building retention-janitor into .tmp/bin"
(cd "$root" && go build -o "$bindir/retention-janitor" ./services/retention-janitor) || die "go build retention-janitor failed"
"$bindir/envctl" migrate --database-url "$dsn" --timeout 2m >&2

ingest_dsn=$(dsn_with_user "$dsn" envelopeworker_ingest)
answers "$ingest_dsn" || ingest_dsn=$dsn
janitor_dsn=$(dsn_with_user "$dsn" envelopeworker_janitor)
if answers "$janitor_dsn"; then
	janitor_as=envelopeworker_janitor
else
	log "the server does not let envelopeworker_janitor in without a password; the janitor uses the admin DSN"
	janitor_dsn=$dsn
	janitor_as=admin
fi

port=$(free_port 18280)
mport=$(free_port $((port + 1)))
url="http://127.0.0.1:$port"
murl="http://127.0.0.1:$mport/metrics"
# Limiters opened wide, as in bench-ingest.sh (see there why not more than 1.8M per hour).
(
	export DATABASE_URL="$ingest_dsn" INGEST_ADDR="127.0.0.1:$port" METRICS_ADDR="127.0.0.1:$mport" \
		SYNC_LIMIT_TOKENS=1000000 SYNC_LIMIT_INTERVAL=1s PEER_LIMIT_TOKENS=1000000 PEER_LIMIT_INTERVAL=1s \
		LOG_LEVEL=warn
	start_ingest "$pidfile" "$work/ingest-api.log"
)
wait_ready "$url" "$pidfile" "$work/ingest-api.log" 60
"$bindir/loadgen-ingest" setup --database-url "$dsn" --producers "$producers" --out "$work/creds.json" >&2

psql_admin() { psql "$dsn" -XqAt -v ON_ERROR_STOP=1 "$@"; }

# The expired backlog lives in its own tenant, with the key that signed it (retired long ago) and its
# stream, whose cursor covers every seeded sequence, so the database stays one `envctl verify` accepts.
psql_admin -c "INSERT INTO producer_keys (tenant_id, key_id, public_key, state, retired_at)
	VALUES ('bench-expired', 'k-expired', sha256('bench-expired'::bytea), 'retired', now() - interval '200 days')" ||
	die "seeding the expired tenant's key failed"
next_seq=1
# seed_payloads N expired|live: N more identities of stream (bench-expired, p-expired, d-expired), each with
# a payload of about jbytes bytes; an expired one's expires_at is spread over a few minutes a day ago, as a
# real backlog is, a live one's lies 1,000 days ahead. Every measured run follows a seed of N rows (live
# ones before ingest alone), so each starts with the same rows just written and the same share of
# shared_buffers taken by them; only what the janitor itself does differs.
# Each payload is shaped like a signed envelope (hex ids, an 86-character signature, telemetry readings
# with random values), not padding: how well its pages compress is part of what WAL a delete writes.
seed_payloads() {
	local from=$next_seq to=$((next_seq + $1 - 1)) base
	case "$2" in
	expired) base="1 day ago" ;;
	live) base="1000 days" ;;
	*) die "seed_payloads: $2" ;;
	esac
	psql_admin -v from="$from" -v to="$to" -v bytes="$jbytes" -v base="$base" <<'SQL' || die "seeding $2 payloads failed"
BEGIN;
INSERT INTO event_identities
	(tenant_id, event_identity, project_id, producer_id, sequence, idempotency_digest, content_digest, key_id, issued_at, received_at)
SELECT 'bench-expired', sha256(('e' || i)::bytea), 'p-expired', 'd-expired', i, sha256(('i' || i)::bytea),
	sha256(('c' || i)::bytea), 'k-expired', now() - interval '100 days', now() - interval '100 days'
FROM generate_series(:from::bigint, :to::bigint) AS i;
-- Fresh statistics before the payloads' foreign-key checks are planned: on a new table they would
-- otherwise scan every identity for every payload.
ANALYZE event_identities;
INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at)
SELECT 'bench-expired', sha256(('e' || i)::bytea),
	convert_to(left(format('{"event_id":"%s","idempotency_key":"%s","issued_at":"2026-08-01T00:00:%s.000Z",'
		'"key_id":"k-expired","metadata":{"kind":"telemetry.batch"},"payload":{"readings":[%s]},'
		'"producer_id":"d-expired","project_id":"p-expired","schema_version":1,"sequence":%s,'
		'"signature":"%s","tenant_id":"bench-expired"}',
		md5('e' || i), md5('i' || i), lpad((i % 60)::text, 2, '0'),
		(SELECT string_agg(format('{"t":%s,"v":%s}', 1754006400 + i * 60 + k, round(random()::numeric, 4)), ',')
		 FROM generate_series(1, greatest(1, (:bytes - 420) / 27)) AS k),
		i, translate(encode(sha512(('s' || i)::bytea), 'base64'), E'\n=', '')), :bytes), 'UTF8'),
	now() + :'base'::interval + make_interval(secs => (i % 300000) / 1000.0)
FROM generate_series(:from::bigint, :to::bigint) AS i;
INSERT INTO streams (tenant_id, project_id, producer_id, cursor) VALUES ('bench-expired', 'p-expired', 'd-expired', :to)
ON CONFLICT (tenant_id, project_id, producer_id) DO UPDATE SET cursor = EXCLUDED.cursor, updated_at = now();
COMMIT;
SQL
	next_seq=$((to + 1))
}
expired_left() { psql_admin -c "SELECT count(*) FROM inbound_payloads WHERE expires_at <= now()"; }
# settle: dead tuples of the last round vacuumed, statistics fresh, dirty pages flushed, so no
# measurement pays for the one before it.
settle() {
	psql_admin -c "VACUUM ANALYZE inbound_payloads" -c "VACUUM ANALYZE event_identities" -c "CHECKPOINT" ||
		die "VACUUM/CHECKPOINT failed (needs the admin DSN)"
}

# envelopes_seen -> the sum of ingest-api's envelopes_total counter (0 before any request).
envelopes_seen() {
	curl -fsS --max-time 2 "$murl" 2>/dev/null |
		awk '/^envelopeworker_ingest_envelopes_total/ { s += $NF } END { printf "%d", s }'
}

field() { printf '%s' "$1" | sed -n -E 's/.*"'"$2"'":"?([0-9A-Za-z_.e+-]+)"?.*/\1/p' | head -n 1; }
ms() { awk -v ns="$1" 'BEGIN { printf "%.1f", ns / 1e6 }'; }
status=0

# ingest_run OUTFILE [SECONDS]: one load generator run in the background; sets loadgen_pid.
ingest_run() {
	local secs=${2:-$seconds}
	timeout $((secs + 180)) "$bindir/loadgen-ingest" run --url "$url" --creds "$work/creds.json" \
		--producers "$producers" --count "$((rate * (secs + 5)))" --duration "${secs}s" --rate "$rate" \
		--payload-bytes "$payload" --json >"$1" 2>"$1.err" &
	loadgen_pid=$!
}

# ingest_wait OUTFILE: waits for the load generator (not in a subshell: it is this shell's child) and
# sets report; marks the benchmark failed when an envelope was not accepted.
report=""
ingest_wait() {
	local rc=0
	wait "$loadgen_pid" || rc=$?
	loadgen_pid=""
	report=$(cat "$1")
	if [ "$rc" != 0 ] || [ -z "$report" ]; then
		log "load generator exit $rc: $(tail -n 3 "$1.err" 2>/dev/null) $report"
		status=1
	fi
}

rows=()
row() { rows+=("$(printf '%-5s %-16s %7s %7s %7s %8s %8s %7s %7s %7s %7s %7s %5s %9s %9s %8s %9s' "$@")"); }
row "round" "run" "env/s" "p50ms" "p99ms" "p99.9ms" "maxms" "WAL MB" "FPI k" "fsyncs" "bkwr k" "read k" "cpu%" "j.rows" "j.secs" "j.rows/s" "overlap s"
# What the whole server and machine did during a run (ours and any neighbour's): the WAL bytes the
# flushes carry, the full-page images among the records and the WAL fsyncs (pg_stat_wal); the dirty
# buffers backends had to write out themselves to make room (pg_stat_bgwriter.buffers_backend) and the
# blocks read into shared_buffers (pg_stat_database.blks_read, this database); and the machine's CPU
# busy share over all its CPUs (/proc/stat: neither idle, iowait nor steal). Backends report within a
# second, so a run's tail may count in the next one. Through to_jsonb, a column this server lacks
# (buffers_backend went to pg_stat_io in PostgreSQL 17, wal_sync in 18) reads as empty, and its column
# shows '-'; so does the CPU column where /proc/stat is missing.
# cpu_mark -> "BUSY:TOTAL" jiffies (guest time is already in user and nice, so fields 10-11 are left out).
cpu_mark() {
	awk '$1 == "cpu" { t = 0; for (i = 2; i <= 9 && i <= NF; i++) t += $i; printf "%.0f:%.0f", t - $5 - $6 - $9, t; exit }' /proc/stat 2>/dev/null || true
}
# wal_mark -> "LSN,FPI,FSYNCS,BACKEND-WRITES,READS,CPU"; fails when the server does not answer.
wal_mark() {
	local q
	q=$(psql_admin -c "SELECT pg_current_wal_lsn() || ',' || coalesce(w->>'wal_fpi', '') || ',' || coalesce(w->>'wal_sync', '')
		|| ',' || coalesce(b->>'buffers_backend', '') || ',' || (SELECT blks_read FROM pg_stat_database WHERE datname = current_database())
		FROM (SELECT to_jsonb(s) AS w FROM pg_stat_wal s) AS x, (SELECT to_jsonb(g) AS b FROM pg_stat_bgwriter g) AS y") || return 1
	[ -n "$q" ] || return 1
	printf '%s,%s\n' "$q" "$(cpu_mark)"
}
# wal_delta MARK -> "MB FPI-thousands FSYNCS BACKEND-WRITES-thousands READS-thousands CPU%" since MARK;
# fails when the server does not answer (its caller's assignment then stops the script).
wal_delta() {
	local lsn fpi syncs bw rd cpu now now_lsn now_fpi now_syncs now_bw now_rd now_cpu mb
	IFS=, read -r lsn fpi syncs bw rd cpu <<<"$1"
	now=$(wal_mark) || return 1
	IFS=, read -r now_lsn now_fpi now_syncs now_bw now_rd now_cpu <<<"$now"
	mb=$(psql_admin -c "SELECT round(pg_wal_lsn_diff('$now_lsn', '$lsn') / 1048576.0, 1)") || return 1
	awk -v mb="$mb" -v f0="$fpi" -v f1="$now_fpi" -v s0="$syncs" -v s1="$now_syncs" -v b0="$bw" -v b1="$now_bw" \
		-v r0="$rd" -v r1="$now_rd" -v c0="$cpu" -v c1="$now_cpu" '
function k(a, b) { return (a == "" || b == "" ? "-" : sprintf("%.1f", (b - a) / 1000)) }
BEGIN {
	split(c0, x, ":"); split(c1, y, ":")
	cpu = (c0 == "" || c1 == "" || y[2] <= x[2] ? "-" : sprintf("%.0f", 100 * (y[1] - x[1]) / (y[2] - x[2])))
	printf "%s %s %s %s %s %s\n", (mb == "" ? "-" : mb), k(f0, f1), (s0 == "" || s1 == "" ? "-" : s1 - s0), k(b0, b1), k(r0, r1), cpu }'
}
base_p99=()
declare -A jan_p99=() jan_rps=() # by variant number: space-separated, one per round
overlaps=()

run_baseline() {
	local r=$1 out mark delta wal
	log "round $r: (a) ingest alone, ${rate} env/s for ${seconds}s"
	mark=$(wal_mark)
	ingest_run "$work/a$r.json"
	ingest_wait "$work/a$r.json"
	out=$report
	delta=$(wal_delta "$mark") # not inside <<<, where set -e would not see a failure
	read -r -a wal <<<"$delta"
	base_p99+=("$(field "$out" p99_ns)")
	row "$r" "a ingest alone" "$(printf '%.0f' "$(field "$out" envelopes_per_second)")" \
		"$(ms "$(field "$out" p50_ns)")" "$(ms "$(field "$out" p99_ns)")" "$(ms "$(field "$out" p999_ns)")" \
		"$(ms "$(field "$out" max_ns)")" "${wal[@]}" "-" "-" "-" "-"
}

# run_with_janitor ROUND VARIANT: ingest beside one janitor run with variant number VARIANT's settings.
run_with_janitor() {
	local r=$1 vi=$2 out before mark delta wal i t_ing t_js t_je t_ie sum jr js stopped overlap rps jrc=0 tag
	local -a jenv=()
	tag="$r.$vi"
	[ -z "${variants[$vi]}" ] || IFS=, read -r -a jenv <<<"${variants[$vi]}"
	log "round $r: (j$vi) ingest with a janitor run over $jrows expired rows (as $janitor_as; ${variants[$vi]:-defaults})"
	before=$(envelopes_seen)
	mark=$(wal_mark)
	ingest_run "$work/b$tag.json"
	# The load generator signs every envelope before its clock starts: wait (bounded) for its first
	# accepted envelope, so the janitor runs inside the measured window.
	t_ing=""
	for i in $(seq 1 600); do
		if [ "$(envelopes_seen)" -gt "$before" ]; then t_ing=$(now); break; fi
		kill -0 "$loadgen_pid" 2>/dev/null || break
		sleep 0.1
	done
	[ -n "$t_ing" ] || { ingest_wait "$work/b$tag.json"; die "ingest never started in round $r"; }
	sleep "$jdelay"
	t_js=$(now)
	env DATABASE_URL="$janitor_dsn" JANITOR_TIMEOUT=5m LOG_LEVEL=info "${jenv[@]}" \
		timeout 330 "$bindir/retention-janitor" >"$work/janitor$tag.log" 2>&1 &
	janitor_pid=$!
	wait "$janitor_pid" || jrc=$?
	janitor_pid=""
	t_je=$(now)
	ingest_wait "$work/b$tag.json"
	out=$report
	delta=$(wal_delta "$mark")
	read -r -a wal <<<"$delta"
	# Ingest's window ends elapsed_ns after its clock started (about when the first envelope was seen).
	t_ie=$(awk -v s="$t_ing" -v ns="$(field "$out" elapsed_ns)" 'BEGIN { printf "%.3f", s + ns / 1e9 }')
	sum=$(grep '"msg":"retention summary"' "$work/janitor$tag.log" | tail -n 1 || true)
	jr=$(field "$sum" rows_deleted)
	js=$(field "$sum" duration_seconds)
	stopped=$(field "$sum" stopped_by)
	if [ "$jrc" != 0 ] || [ "$stopped" != done ] || [ "${jr:-0}" != "$jrows" ]; then
		log "janitor run in round $r: exit $jrc, stopped_by ${stopped:-?}, rows ${jr:-?} (want $jrows); log: ${work#"$root"/}/janitor$tag.log"
		status=1
	fi
	overlap=$(awk -v a="$t_js" -v b="$t_je" -v c="$t_ing" -v d="$t_ie" \
		'BEGIN { s = (a > c ? a : c); e = (b < d ? b : d); printf "%.1f", (e > s ? e - s : 0) }')
	overlaps+=("$overlap")
	rps=$(awk -v n="${jr:-0}" -v s="${js:-0}" 'BEGIN { printf "%.0f", (s > 0 ? n / s : 0) }')
	jan_p99[$vi]+="$(field "$out" p99_ns) "
	jan_rps[$vi]+="$rps "
	row "$r" "j$vi + janitor" "$(printf '%.0f' "$(field "$out" envelopes_per_second)")" \
		"$(ms "$(field "$out" p50_ns)")" "$(ms "$(field "$out" p99_ns)")" "$(ms "$(field "$out" p999_ns)")" \
		"$(ms "$(field "$out" max_ns)")" "${wal[@]}" "${jr:-?}" "$(printf '%.2f' "${js:-0}")" "$rps" "$overlap"
}

# Warm-up, not recorded: the first run after start-up pays for cold caches, connection pools and
# prepared statements (seen here: p99 of seconds instead of tens of milliseconds).
log "warm-up: ingest alone, ${rate} env/s for 5s (not recorded)"
ingest_run "$work/warmup.json" 5
ingest_wait "$work/warmup.json"

# Each round runs ingest alone (slot 0) and beside each variant (slots 1..n), the order rotated by one
# slot per round, so drift in the machine's load spreads over all of them.
slots=$((${#variants[@]} + 1))
for r in $(seq 1 "$rounds"); do
	for k in $(seq 0 $((slots - 1))); do
		slot=$(((k + r - 1) % slots))
		if [ "$slot" = 0 ]; then
			log "round $r: seeding $jrows live payloads (${jbytes} B each)"
			seed_payloads "$jrows" live
			settle
			run_baseline "$r"
			continue
		fi
		log "round $r: seeding $jrows expired payloads (${jbytes} B each)"
		seed_payloads "$jrows" expired
		settle
		run_with_janitor "$r" $((slot - 1))
		left=$(expired_left)
		[ "$left" = 0 ] || { log "round $r left $left expired payloads"; status=1; }
	done
	settle
done

echo
echo "retention-janitor vs concurrent ingest ($(date -u +%Y-%m-%dT%H:%MZ); $rounds rounds; ingest ${rate} env/s," \
	"$producers producers, single route, ${seconds}s, payload ${payload} B; janitor $jrows rows of ${jbytes} B," \
	"as $janitor_as; load average at start $load_start, at end $(loadavg))"
# The settings each variant ran with, as its last summary line reports them.
for vi in "${!variants[@]}"; do
	jsum=$(grep -h '"msg":"retention summary"' "$work"/janitor*."$vi".log 2>/dev/null | tail -n 1 || true)
	echo "j$vi: ${variants[$vi]:-defaults}: batch $(field "$jsum" batch_size), at most $(field "$jsum" max_rows_per_second) rows/s (0: no cap), wal_compression $(field "$jsum" wal_compression)"
done
printf '%s\n' "${rows[@]}"
# The verdict uses medians: one run that a neighbour's burst of load hits must not decide it either way.
for vi in "${!variants[@]}"; do
	awk -v name="j$vi" -v b="${base_p99[*]}" -v j="${jan_p99[$vi]}" -v rps="${jan_rps[$vi]}" '
function median(a, n,   i, k, t) {
	for (i = 2; i <= n; i++) { t = a[i]; for (k = i - 1; k >= 1 && a[k] > t; k--) a[k + 1] = a[k]; a[k + 1] = t }
	return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
BEGIN {
	n = split(b, bs, " "); split(j, js, " "); m = split(rps, rs, " ")
	line = ""
	for (i = 1; i <= n; i++) {
		ratio[i] = (bs[i] > 0 ? js[i] / bs[i] : 0)
		line = line sprintf(" %.2f", ratio[i])
	}
	if (n > 0) {
		printf "%s: p99 with janitor / alone by round:%s\n", name, line
		mr = median(ratio, n)
		printf "%s: median p99 alone %.1f ms, with janitor %.1f ms; median per-round ratio %.2f (%+.0f %%): target < +25 %% %s; janitor median %.0f payload rows/s\n",
			name, median(bs, n) / 1e6, median(js, n) / 1e6, mr, (mr - 1) * 100, (mr < 1.25 ? "met" : "NOT met"), median(rs, m)
	}
}'
done
awk -v o="${overlaps[*]}" -v secs="$seconds" 'BEGIN {
	n = split(o, os, " "); for (i = 1; i <= n; i++) if (os[i] < secs / 2) short++
	if (short) printf "note: in %d of %d janitor runs the janitor overlapped less than half of the %ds ingest run, so its effect on p99 is diluted; seed more rows (BENCH_JANITOR_ROWS) or shorten BENCH_SECONDS\n", short, n, secs
}'
exit "$status"
