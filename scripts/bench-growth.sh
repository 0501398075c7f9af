#!/usr/bin/env bash
# bench-growth.sh — ingest cost as data grows (issue 18): ingest-api throughput and latency with 16
# producers on an empty database and on databases already holding SIZE retained identities (each with
# its payload and one audit row), same run, rounds alternating between the sizes; prints a table and
# each size's throughput loss against the first size.
#
#   scripts/bench-growth.sh
#   BENCH_SIZES="0 1000000 5000000"  retained identities per database (the first is the baseline)
#   BENCH_SECONDS=10          length of each run (each run also stops when its signed envelopes run out)
#   BENCH_PRODUCERS=16        concurrent producers, each its own new stream, all in one fresh tenant
#   BENCH_ROUNDS=2            rounds; each round runs every size once, odd rounds in reverse order; 0 seeds
#                             the databases and measures nothing (with BENCH_KEEP_DB=1, for BENCH_REUSE_DB)
#   BENCH_BATCH=0             envelopes per batch request for a batch run after each single run (0: none)
#   BENCH_COUNT=200000        envelopes signed ahead per run (memory bound)
#   BENCH_PAYLOAD_BYTES=600   padding per payload of the runs: about 1 KiB signed envelopes
#   BENCH_SEED_TENANTS=1000   tenants the seeded rows are spread over
#   BENCH_SEED_STREAMS=20     producers (streams) per seeded tenant
#   BENCH_SEED_ENVELOPE_BYTES=1000  size of each seeded stored envelope
#   BENCH_SEED_CHUNK=500000   rows per seeding statement (one transaction each)
#   BENCH_LAYOUT=plain        layouts (envctl migrate --layout), e.g. "plain partitioned": each size is
#                             seeded once per layout, and every round runs every (layout, size)
#   BENCH_KEEP_DB=1           keep the databases afterwards (dropped by default)
#   BENCH_REUSE_DB=1          use a kept database of a size > 0 again when it holds exactly that many
#                             identities and their streams (seeded, never measured); others start fresh
#
# For each layout and size it makes a fresh database envelopeworker_growth_<layout>_<size>, migrates it, fills it in SQL
# (INSERT … SELECT … FROM generate_series, no API call): identities with payloads that expire in 30
# days, the audit row of each, and the streams they belong to, spread over BENCH_SEED_TENANTS tenants
# with BENCH_SEED_STREAMS producers each; then VACUUM ANALYZE (on the partitioned layout: of the
# partitions, not of the partitioned parents, which is all autovacuum ever analyzes), and loadgen-ingest setup of the measured
# producers in a tenant of their own. Before seeding it checks the free disk space of the PostgreSQL
# data directory (when it can see it) and refuses a size that would not fit twice (WAL).
#
# Each measured run starts ingest-api on that size's database (limiters opened wide, as bench-ingest.sh
# does), waits for it, CHECKPOINTs, runs loadgen-ingest on a fresh project (new streams, so sequences run
# 1, 2, 3, …, while the tables and their indexes are large), then stops it: only one ingest-api holds
# connections at a time. The load average is sampled before and after every run, and `uptime` is logged
# at the start of every round. Odd rounds run the sizes in reverse order, and within each size the
# layouts alternate too, so a load that rises through the run is spread over every database.
set -euo pipefail
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

sizes=${BENCH_SIZES:-"0 1000000 5000000"}
seconds=${BENCH_SECONDS:-10}
producers=${BENCH_PRODUCERS:-16}
rounds=${BENCH_ROUNDS:-2}
batch=${BENCH_BATCH:-0}
count=${BENCH_COUNT:-200000}
payload=${BENCH_PAYLOAD_BYTES:-600}
seed_tenants=${BENCH_SEED_TENANTS:-1000}
seed_streams=${BENCH_SEED_STREAMS:-20}
seed_bytes=${BENCH_SEED_ENVELOPE_BYTES:-1000}
chunk=${BENCH_SEED_CHUNK:-500000}
layouts=${BENCH_LAYOUT:-plain}
for v in "$seconds" "$producers" "$rounds" "$batch" "$count" "$payload" "$seed_tenants" "$seed_streams" "$seed_bytes" "$chunk" $sizes; do
	case "$v" in '' | *[!0-9]*) die "every BENCH_ number must be a non-negative integer (got '$v')" ;; esac
done
[ -n "$sizes" ] || die "BENCH_SIZES is empty"
[ "$producers" -ge 1 ] && [ "$seed_tenants" -ge 1 ] && [ "$seed_streams" -ge 1 ] &&
	[ "$chunk" -ge 1 ] && [ "$seed_bytes" -ge 100 ] || die "BENCH_PRODUCERS, _SEED_TENANTS, _SEED_STREAMS, _SEED_CHUNK must be ≥ 1, _SEED_ENVELOPE_BYTES ≥ 100"
for l in $layouts; do
	case "$l" in plain | partitioned) ;; *) die "BENCH_LAYOUT must list plain and/or partitioned (got '$l')" ;; esac
done
[ -n "$layouts" ] || die "BENCH_LAYOUT is empty"
[ "$count" -ge "$producers" ] || count=$producers
[ "$rounds" -gt 0 ] || [ "${BENCH_KEEP_DB:-0}" = 1 ] || die "BENCH_ROUNDS=0 only seeds: it needs BENCH_KEEP_DB=1"
bench_init bench-growth
dbs=()
cleanup() {
	stop_pidfile "$pidfile" ingest-api
	rm -f "$work"/creds-*.json # tokens and seeds of producers whose database is about to go
	if [ "${BENCH_KEEP_DB:-0}" != 1 ] && [ -n "$admin" ]; then
		for d in "${dbs[@]}"; do
			PGOPTIONS="-c client_min_messages=warning" psql "$admin" -XqAt -c "DROP DATABASE IF EXISTS $d WITH (FORCE)" >/dev/null 2>&1 || true
		done
	fi
	release_pg "" 1 # the databases are dropped above; this only stops a cluster pg.sh started
}
trap cleanup EXIT

use_pg
build_bins

loadavg() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo "?"; }

# Bytes one seeded identity costs on disk, all told: identity row and its four indexes, payload row
# (envelope inline: under the 2 KiB TOAST threshold) and its two indexes, audit row and its key. The WAL
# of the load is about as much again, hence the factor 2 in the check.
per_row=$((700 + seed_bytes + 250))
datadir=$(psql "$admin" -XAtc 'SHOW data_directory' 2>/dev/null || true)
free_bytes() {
	[ -n "$datadir" ] && [ -d "$datadir" ] || return 1
	df -Pk "$datadir" | awk 'NR == 2 { print $4 * 1024 }'
}

dsn_of() { dsn_with_db "$admin" "envelopeworker_growth_$1_$2"; } # layout, size

seed() {
	local size=$1 dsn=$2 layout=$3 from to started tables
	started=$(date +%s)
	# Row g (1 … size) of tenant g % T, stream (g / T) % S of it, sequence g / (T × S) + 1: every
	# (tenant, project, producer, sequence) is distinct and each stream's sequences are contiguous from 1.
	# Digests are sha256 of distinct strings: as random as the real ones, so the unique indexes split pages
	# as they do in production. Rows were received over the last 30 days; their payloads expire over the
	# next 30 (retained, nothing for the janitor).
	from=1
	while [ "$from" -le "$size" ]; do
		to=$((from + chunk - 1))
		[ "$to" -le "$size" ] || to=$size
		psql "$dsn" -XqAt -v ON_ERROR_STOP=1 -v from="$from" -v to="$to" -v tenants="$seed_tenants" \
			-v streams="$seed_streams" -v bytes="$seed_bytes" >/dev/null <<'SQL' || die "seeding rows $from-$to failed"
BEGIN;
CREATE TEMP TABLE seed ON COMMIT DROP AS
SELECT 'tn-' || lpad((g % :tenants)::text, 6, '0') AS tenant_id,
       'proj-' || ((g / :tenants) % :streams % 4) AS project_id,
       'dev-' || lpad(((g / :tenants) % :streams)::text, 4, '0') AS producer_id,
       g / (:tenants::bigint * :streams) + 1 AS sequence,
       sha256(('ei' || g)::bytea) AS event_identity,
       now() - (g % 2592000) * interval '1 second' AS received_at,
       g
FROM generate_series(:from::bigint, :to::bigint) g;
INSERT INTO event_identities (tenant_id, event_identity, project_id, producer_id, sequence, idempotency_digest,
                              content_digest, key_id, issued_at, received_at)
SELECT tenant_id, event_identity, project_id, producer_id, sequence, sha256(('ik' || g)::bytea),
       sha256(('cd' || g)::bytea), producer_id || '-k1', received_at - interval '2 seconds', received_at
FROM seed;
INSERT INTO inbound_payloads (tenant_id, event_identity, envelope, expires_at)
SELECT tenant_id, event_identity,
       convert_to(rpad('{"v":1,"tenant_id":"' || tenant_id || '","project_id":"' || project_id ||
                       '","producer_id":"' || producer_id || '","sequence":' || sequence || ',"payload":"' ||
                       md5(g::text), :bytes - 2, md5(g::text)) || '"}', 'UTF8'),
       received_at + interval '60 days'
FROM seed;
INSERT INTO audit_events (tenant_id, project_id, account_id, device_id, event_identity, outcome, correlation_id, at)
SELECT tenant_id, project_id, 'acct-' || tenant_id, producer_id, encode(event_identity, 'hex'), 'accepted',
       'req-' || md5('c' || g), received_at
FROM seed;
COMMIT;
SQL
		log "size $size: seeded rows $from-$to ($(($(date +%s) - started)) s so far, load $(loadavg))"
		from=$((to + 1))
	done
	# The streams the seeded identities belong to, their cursors at their last sequence.
	psql "$dsn" -XqAt -v ON_ERROR_STOP=1 >/dev/null <<'SQL' || die "seeding streams failed"
INSERT INTO streams (tenant_id, project_id, producer_id, cursor)
SELECT tenant_id, project_id, producer_id, max(sequence) FROM event_identities
GROUP BY tenant_id, project_id, producer_id;
SQL
	# ANALYZE of a partitioned parent samples its partitions into parent statistics, which autovacuum
	# never does (docs/scaling.md): the partitioned databases get their partitions analyzed only, as
	# production would have them.
	tables="event_identities, inbound_payloads, audit_events"
	if [ "$layout" = partitioned ]; then
		tables=$(psql "$dsn" -XAt -v ON_ERROR_STOP=1 -c "SELECT string_agg(inhrelid::regclass::text, ', ')
FROM pg_inherits WHERE inhparent IN ('event_identities'::regclass, 'inbound_payloads'::regclass, 'audit_events'::regclass)") ||
			die "listing partitions failed"
	fi
	PGOPTIONS="-c client_min_messages=warning" psql "$dsn" -XqAt -v ON_ERROR_STOP=1 \
		-c "VACUUM ANALYZE $tables, streams" >/dev/null ||
		die "VACUUM ANALYZE failed"
	log "$layout size $size: seeded and vacuumed in $(($(date +%s) - started)) s"
}

declare -A seed_secs
for layout in $layouts; do for size in $sizes; do
	db="envelopeworker_growth_${layout}_$size"
	need_bytes=$((size * per_row * 2))
	if fb=$(free_bytes); then
		[ "$need_bytes" -lt "$fb" ] ||
			die "size $size needs about $((need_bytes >> 30)) GiB free next to PostgreSQL's data, $((fb >> 30)) GiB are: lower BENCH_SIZES"
	else
		log "cannot see PostgreSQL's data directory: size $size goes ahead unchecked (needs about $((need_bytes >> 30)) GiB)"
	fi
	dbs+=("$db")
	dsn=$(dsn_of "$layout" "$size")
	t0=$(date +%s)
	if [ "${BENCH_REUSE_DB:-0}" = 1 ] && [ "$size" -gt 0 ] && [ "$(psql "$dsn" -XAt -c "SELECT (SELECT count(*) FROM event_identities) = $size
AND EXISTS (SELECT FROM streams) AND (SELECT layout FROM schema_layout) = '$layout'" 2>/dev/null)" = t ]; then
		log "reusing $db: $size seeded identities"
		seed_secs[$layout/$size]=reused
	else
		log "fresh database $db on $(redact "$admin")"
		fresh_db "$admin" "$db"
		"$bindir/envctl" migrate --database-url "$dsn" --layout "$layout" >&2
		[ "$size" -gt 0 ] && seed "$size" "$dsn" "$layout"
		seed_secs[$layout/$size]=$(($(date +%s) - t0))
	fi
	[ "$rounds" -gt 0 ] || continue
	"$bindir/loadgen-ingest" setup --database-url "$dsn" --tenant growth-bench --producers "$producers" \
		--out "$work/creds-${layout}_$size.json" >&2
done; done

if [ "$rounds" = 0 ]; then
	log "seeded and kept: ${dbs[*]}"
	exit 0
fi
port=$(free_port 18180)
mport=$(free_port $((port + 1)))
url="http://127.0.0.1:$port"

field() { printf '%s' "$1" | sed -n -E 's/.*"'"$2"'":([0-9.e+-]+).*/\1/p'; }
ms() { awk -v ns="$1" 'BEGIN { printf "%.2f", ns / 1e6 }'; }

rows=()
row() { rows+=("$(printf '%-12s %-10s %5s %-8s %12s %9s %9s %9s %11s' "$@")"); }
row "layout" "size" "round" "route" "envelopes/s" "p50 ms" "p99 ms" "p99.9 ms" "load avg"
status=0
declare -A sum_rate nruns
for round in $(seq 1 "$rounds"); do
	order=$sizes
	[ $((round % 2)) = 0 ] && order=$(printf '%s\n' $sizes | tac | tr '\n' ' ')
	log "round $round: $(uptime)"
	flip=$round
	for size in $order; do
		lorder=$layouts
		flip=$((flip + 1))
		[ $((flip % 2)) = 0 ] && lorder=$(printf '%s\n' $layouts | tac | tr '\n' ' ')
		for layout in $lorder; do
			dsn=$(dsn_of "$layout" "$size")
			ingest_dsn=$(dsn_with_user "$dsn" envelopeworker_ingest)
			answers "$ingest_dsn" || ingest_dsn=$dsn
			# Limiters opened wide as in bench-ingest.sh (see its comment on go-limiter's refill bound).
			(
				export DATABASE_URL="$ingest_dsn" INGEST_ADDR="127.0.0.1:$port" METRICS_ADDR="127.0.0.1:$mport" \
					SYNC_LIMIT_TOKENS=1000000 SYNC_LIMIT_INTERVAL=1s PEER_LIMIT_TOKENS=1000000 PEER_LIMIT_INTERVAL=1s \
					LOG_LEVEL=warn
				start_ingest "$pidfile" "$work/ingest-api-${layout}_$size.log"
			)
			wait_ready "$url" "$pidfile" "$work/ingest-api-${layout}_$size.log" 60
			routes=(single)
			[ "$batch" -gt 0 ] && routes+=(batch)
			for route in "${routes[@]}"; do
				args=()
				[ "$route" = batch ] && args=(--batch "$batch")
				PGOPTIONS="-c client_min_messages=warning" psql "$admin" -XqAt -c CHECKPOINT >/dev/null 2>&1 ||
					log "CHECKPOINT refused (not superuser?): runs are not settled"
				l0=$(loadavg)
				log "round $round, $layout size $size, $route, $producers producers, up to ${seconds}s or $count envelopes (load $l0)"
				out=$("$bindir/loadgen-ingest" run --url "$url" --creds "$work/creds-${layout}_$size.json" --producers "$producers" \
					--count "$count" --duration "${seconds}s" --payload-bytes "$payload" --json "${args[@]}") || status=1
				rate=$(field "$out" envelopes_per_second)
				row "$layout" "$size" "$round" "$route" "$(printf '%.0f' "${rate:-0}")" "$(ms "$(field "$out" p50_ns)")" \
					"$(ms "$(field "$out" p99_ns)")" "$(ms "$(field "$out" p999_ns)")" "$l0→$(loadavg)"
				log "measured: ${rows[-1]}" # as it comes: a run cut short still has its figures
				if [ "$(field "$out" transport_errors)" != 0 ] || printf '%s' "$out" | grep -q '"refused":{"'; then
					log "not every envelope was accepted: $out"
					status=1
				fi
				k="$layout/$size/$route"
				sum_rate[$k]=$(awk -v a="${sum_rate[$k]:-0}" -v b="${rate:-0}" 'BEGIN { print a + b }')
				nruns[$k]=$((${nruns[$k]:-0} + 1))
		done
		stop_pidfile "$pidfile" ingest-api
		done
	done
done

echo
echo "ingest-api with data already retained ($(date -u +%Y-%m-%dT%H:%MZ), ${seconds}s per run, $producers producers," \
	"payload ${payload} B, seed over $seed_tenants tenants × $seed_streams streams, layouts $layouts)"
printf '%s\n' "${rows[@]}"
echo
base=${sizes%% *}
printf '%-12s %-10s %-8s %14s %12s %12s\n' "layout" "size" "route" "mean env/s" "vs $base" "seeded in s"
for layout in $layouts; do for route in single batch; do
	[ -n "${nruns[$layout/$base/$route]:-}" ] || continue
	b=$(awk -v s="${sum_rate[$layout/$base/$route]}" -v n="${nruns[$layout/$base/$route]}" 'BEGIN { print s / n }')
	for size in $sizes; do
		k="$layout/$size/$route"
		m=$(awk -v s="${sum_rate[$k]}" -v n="${nruns[$k]}" 'BEGIN { print s / n }')
		printf '%-12s %-10s %-8s %14.0f %11s %12s\n' "$layout" "$size" "$route" "$m" \
			"$(awk -v m="$m" -v b="$b" 'BEGIN { if (b > 0) printf "%+.1f %%", (m - b) / b * 100; else print "-" }')" "${seed_secs[$layout/$size]}"
	done
done; done
exit "$status"
