#!/usr/bin/env bash
# bench-ingest.sh — ingest-api alone over loopback HTTP, next to pgbench's one-transaction-per-envelope
# baseline, at 1, 16 and 64 producers, single and batch routes; prints a table.
#
#   scripts/bench-ingest.sh
#   BENCH_SECONDS=10        length of each run (each run also stops when its signed envelopes run out)
#   BENCH_PRODUCERS="1 16 64"
#   BENCH_BATCH=100         envelopes per batch request
#   BENCH_SINGLE_COUNT=200000 BENCH_BATCH_COUNT=400000   envelopes signed ahead per run (memory bound)
#   BENCH_KEEP_DB=1          keep the envelopeworker_bench database afterwards (dropped by default)
#   BENCH_DB=envelopeworker_bench   the database's name (lower-case letters, digits, _): two trees can
#                            then run it side by side against one server, e.g. a before/after pair
#   BENCH_PAYLOAD_BYTES=600  padding per payload: about 1 KiB signed envelopes, like the pgbench script's rows
#   BENCH_SDK=1              after each load generator run, the same run through the producer module
#                            (loadgen-ingest run --sdk: in-memory store, signing inside the clock)
#
# It ensures PostgreSQL (scripts/pg.sh), makes a fresh database envelopeworker_bench, migrates it, builds
# and starts ingest-api on a free loopback port with limiters opened wide (this measures ingest, not the
# limiter), sets up producers with loadgen-ingest, runs modules/store/bench/ingest.pgbench with pgbench
# when that script exists, then the load generator; stops ingest-api (and a throwaway cluster pg.sh
# started) on exit. Every run starts new streams (a fresh project), so sequences run 1, 2, 3, ..., and
# follows a CHECKPOINT (see settle).
set -euo pipefail
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

seconds=${BENCH_SECONDS:-10}
producers_list=${BENCH_PRODUCERS:-"1 16 64"}
batch=${BENCH_BATCH:-100}
single_count=${BENCH_SINGLE_COUNT:-200000}
batch_count=${BENCH_BATCH_COUNT:-400000}
payload=${BENCH_PAYLOAD_BYTES:-600}
bench_init bench-ingest
db=${BENCH_DB:-envelopeworker_bench}
[[ $db =~ ^[a-z_][a-z0-9_]*$ ]] || die "BENCH_DB must be lower-case letters, digits and _"
cleanup() {
	stop_pidfile "$pidfile" ingest-api
	rm -f "$work/creds.json" # tokens and seeds of producers whose database is about to go
	# The bench database holds hundreds of thousands of envelopes; keep it only when asked.
	release_pg "$db" "${BENCH_KEEP_DB:-0}"
}
trap cleanup EXIT

use_fresh_db "$db"
build_bins
"$bindir/envctl" migrate --database-url "$dsn" >&2

ingest_dsn=$(dsn_with_user "$dsn" envelopeworker_ingest)
answers "$ingest_dsn" || ingest_dsn=$dsn
port=$(free_port 18080)
mport=$(free_port $((port + 1)))
url="http://127.0.0.1:$port"
# Limiters opened wide for the whole benchmark. Not "1e8 per second": go-limiter's memorystore refills a
# bucket with interval/tokens (in ns) tokens per interval, capped at tokens, so above sqrt(interval in ns)
# tokens (about 31,600 for 1s) it refills far less than it says. 1.8M per hour stays under that bound.
(
	export DATABASE_URL="$ingest_dsn" INGEST_ADDR="127.0.0.1:$port" METRICS_ADDR="127.0.0.1:$mport" \
		SYNC_LIMIT_TOKENS=1000000 SYNC_LIMIT_INTERVAL=1s PEER_LIMIT_TOKENS=1000000 PEER_LIMIT_INTERVAL=1s \
		LOG_LEVEL=warn
	start_ingest "$pidfile" "$work/ingest-api.log"
)
wait_ready "$url" "$pidfile" "$work/ingest-api.log" 60

max_producers=0
for p in $producers_list; do [ "$p" -gt "$max_producers" ] && max_producers=$p; done
"$bindir/loadgen-ingest" setup --database-url "$dsn" --producers "$max_producers" --out "$work/creds.json" >&2

# Every measured run starts right after a CHECKPOINT: a run that writes a gigabyte of WAL (the batch runs)
# would otherwise hand the next run the checkpoint it forced, and its burst of full-page images, which
# would land on whichever run came next. Without superuser rights the runs go on unsettled.
settle() {
	PGOPTIONS="-c client_min_messages=warning" psql "$admin" -XqAt -c CHECKPOINT >/dev/null 2>&1 ||
		log "CHECKPOINT refused (not superuser?): runs are not settled"
}

rows=()
row() { rows+=("$(printf '%-32s %9s %13s %9s %9s %9s' "$@")"); }
row "what" "producers" "envelopes/s" "p50 ms" "p99 ms" "p99.9 ms"

# pgbench: the store engineer's script performs the store's ingest statements, one envelope per
# transaction; it is the baseline group commit has to beat.
pgscript="$root/modules/store/bench/ingest.pgbench"
if [ -f "$pgscript" ] && command -v pgbench >/dev/null 2>&1; then
	nproc=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 4)
	for p in $producers_list; do
		jobs=$((p < nproc ? p : nproc))
		settle
		log "pgbench, $p client(s), ${seconds}s"
		# The script keys its streams by :run and counts :seq per client (see its header); :run is spliced
		# into SQL as a number, so it must be digits only and new for every run.
		run_id="$(date +%s)$p"
		out=$(pgbench -n -M prepared -D "run=$run_id" -D seq=0 -f "$pgscript" -c "$p" -j "$jobs" -T "$seconds" "$dsn" 2>&1) ||
			{ printf '%s\n' "$out" | tail -n 5 >&2; die "pgbench failed"; }
		tps=$(printf '%s\n' "$out" | sed -n -E 's/^tps = ([0-9.]+) .*/\1/p' | head -n 1)
		lat=$(printf '%s\n' "$out" | sed -n -E 's/^latency average = ([0-9.]+) ms/\1/p' | head -n 1)
		row "pgbench (1 tx/envelope)" "$p" "$(printf '%.0f' "${tps:-0}")" "avg ${lat:-?}" "-" "-"
	done
else
	log "no modules/store/bench/ingest.pgbench (or no pgbench): skipping the pgbench baseline"
fi

field() { printf '%s' "$1" | sed -n -E 's/.*"'"$2"'":([0-9.e+-]+).*/\1/p'; }
ms() { awk -v ns="$1" 'BEGIN { printf "%.2f", ns / 1e6 }'; }
status=0
single16=""
for mode in single batch; do
	for p in $producers_list; do
		if [ "$mode" = single ]; then
			count=$single_count
			args=()
			what="ingest-api single"
		else
			count=$batch_count
			args=(--batch "$batch")
			what="ingest-api batch of $batch"
		fi
		[ "$count" -ge "$p" ] || count=$p
		variants=(raw)
		[ "${BENCH_SDK:-0}" = 1 ] && variants+=(sdk)
		for variant in "${variants[@]}"; do
			extra=()
			label=$what
			if [ "$variant" = sdk ]; then
				extra=(--sdk)
				label="$what (SDK)"
			fi
			settle
			log "$label, $p producer(s), up to ${seconds}s or $count envelopes"
			out=$("$bindir/loadgen-ingest" run --url "$url" --creds "$work/creds.json" --producers "$p" \
				--count "$count" --duration "${seconds}s" --payload-bytes "$payload" --json "${args[@]}" "${extra[@]}") || status=1
			row "$label" "$p" "$(printf '%.0f' "$(field "$out" envelopes_per_second)")" \
				"$(ms "$(field "$out" p50_ns)")" "$(ms "$(field "$out" p99_ns)")" "$(ms "$(field "$out" p999_ns)")"
			if [ "$variant" = raw ] && [ "$mode" = single ] && [ "$p" = 16 ]; then single16=$(field "$out" envelopes_per_second); fi
			if [ "$(field "$out" transport_errors)" != 0 ] || printf '%s' "$out" | grep -q '"refused":{"'; then
				log "not every envelope was accepted: $out"
				status=1
			fi
		done
	done
done

# The latency target is read at half the flat-out single rate of 16 producers, at a fixed rate (latency
# counted from when each request was due, so queueing behind a slow answer counts).
if [ -n "${single16:-}" ]; then
	half=$(awk -v r="$single16" 'BEGIN { printf "%.0f", r / 2 }')
	settle
	log "ingest-api single, 16 producer(s), fixed $half envelopes/s for ${seconds}s"
	out=$("$bindir/loadgen-ingest" run --url "$url" --creds "$work/creds.json" --producers 16 --rate "$half" \
		--count "$((half * seconds))" --duration "${seconds}s" --payload-bytes "$payload" --json) || status=1
	row "single at half rate ($half/s)" 16 "$(printf '%.0f' "$(field "$out" envelopes_per_second)")" \
		"$(ms "$(field "$out" p50_ns)")" "$(ms "$(field "$out" p99_ns)")" "$(ms "$(field "$out" p999_ns)")"
fi

echo
echo "ingest-api over loopback HTTP vs pgbench ($(date -u +%Y-%m-%dT%H:%MZ), ${seconds}s per run, payload ${payload} B)"
printf '%s\n' "${rows[@]}"
exit "$status"
