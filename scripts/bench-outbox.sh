#!/usr/bin/env bash
# bench-outbox.sh — POST /v1/outbox and /v1/outbox/batch through ingest-api over loopback HTTP (contract
# §8.5, §8.6): one busy producer (16 concurrent requests of one service credential, one outbound stream)
# against the same load over 16 credentials, and batch enqueue against single requests at one producer.
# Alternating rounds; prints one table.
#
#   scripts/bench-outbox.sh
#   BENCH_SECONDS=10      length of each run (each run also stops when its requests run out)
#   BENCH_ROUNDS=3        alternating rounds (each round runs every row once)
#   BENCH_COUNT=200000    messages prepared per run (memory bound)
#   BENCH_PAYLOAD_BYTES=600
#   BENCH_BASE_REV=<git revision>   also run an ingest-api built from that revision (git archive into
#                         .tmp, never a worktree), alternating with this tree's, for a same-run baseline
#   BENCH_KEEP_DB=1       keep the envelopeworker_bench_outbox database afterwards
#
# It ensures PostgreSQL (scripts/pg.sh), makes a fresh database, migrates it, builds ingest-api and
# loadgen-ingest, writes an outbound signing key for the loadgen tenant, sets up 16 service credentials
# and one endpoint (loadgen-ingest setup --outbox; no delivery-worker runs, so messages stay pending),
# and starts ingest-api on a free loopback port with its limiters opened wide. Every run follows a
# CHECKPOINT (see bench-ingest.sh).
set -euo pipefail
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

seconds=${BENCH_SECONDS:-10}
rounds=${BENCH_ROUNDS:-3}
count=${BENCH_COUNT:-200000}
payload=${BENCH_PAYLOAD_BYTES:-600}
base_rev=${BENCH_BASE_REV:-}
bench_init bench-outbox
db=envelopeworker_bench_outbox
cleanup() {
	stop_pidfile "$pidfile" ingest-api
	rm -f "$work/creds.json" "$work/outbound-keys.json"
	release_pg "$db" "${BENCH_KEEP_DB:-0}"
}
trap cleanup EXIT

use_fresh_db "$db"
build_bins
"$bindir/envctl" migrate --database-url "$dsn" >&2
builds=(current)
if [ -n "$base_rev" ]; then
	build_at_rev "$base_rev" "$(ingest_pkg)" "$work/ingest-api-base"
	builds=(base current)
fi

ingest_dsn=$(dsn_with_user "$dsn" envelopeworker_ingest)
answers "$ingest_dsn" || ingest_dsn=$dsn
tenant=loadgen
seed=$(head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')
printf '{"%s":{"key_id":"lg-out-1","seed":"%s"}}\n' "$tenant" "$seed" >"$work/outbound-keys.json"
unset seed
"$bindir/loadgen-ingest" setup --database-url "$dsn" --outbox --tenant "$tenant" --producers 16 \
	--project lg-outbox --topic loadgen.outbox --out "$work/creds.json" >&2

port=$(free_port 18180)
mport=$(free_port $((port + 1)))
url="http://127.0.0.1:$port"
# start BUILD: ingest-api of that build, limiters opened wide (see bench-ingest.sh for the bound).
start() {
	stop_pidfile "$pidfile" ingest-api
	local bin="$bindir/ingest-api"
	[ "$1" = base ] && bin="$work/ingest-api-base"
	cp "$bin" "$work/ingest-api"
	(
		export DATABASE_URL="$ingest_dsn" INGEST_ADDR="127.0.0.1:$port" METRICS_ADDR="127.0.0.1:$mport" \
			SYNC_LIMIT_TOKENS=1000000 SYNC_LIMIT_INTERVAL=1s PEER_LIMIT_TOKENS=1000000 PEER_LIMIT_INTERVAL=1s \
			OUTBOX_LIMIT_TOKENS=1000000 OUTBOX_LIMIT_INTERVAL=1s \
			OUTBOUND_SIGNING_KEYS_FILE="$work/outbound-keys.json" LOG_LEVEL=warn
		if command -v setsid >/dev/null 2>&1; then
			setsid "$work/ingest-api" >"$work/ingest-api.log" 2>&1 </dev/null &
		else
			nohup "$work/ingest-api" >"$work/ingest-api.log" 2>&1 </dev/null &
		fi
		echo $! >"$pidfile"
	)
	wait_ready "$url" "$pidfile" "$work/ingest-api.log" 60
}

settle() {
	PGOPTIONS="-c client_min_messages=warning" psql "$admin" -XqAt -c CHECKPOINT >/dev/null 2>&1 ||
		log "CHECKPOINT refused (not superuser?): runs are not settled"
}

field() { printf '%s' "$1" | sed -n -E 's/.*"'"$2"'":([0-9.e+-]+).*/\1/p'; }
ms() { awk -v ns="$1" 'BEGIN { printf "%.2f", ns / 1e6 }'; }
rows=()
row() { rows+=("$(printf '%-6s %-8s %-34s %9s %11s %9s %9s' "$@")"); }
row "round" "build" "what" "clients" "messages/s" "p50 ms" "p99 ms"
status=0
# run ROUND BUILD WHAT CLIENTS ARGS… -> one row; echoes messages/s.
run() {
	local round=$1 build=$2 what=$3 clients=$4 out
	shift 4
	settle
	log "round $round, $build: $what, $clients client(s)"
	out=$("$bindir/loadgen-ingest" run --url "$url" --creds "$work/creds.json" --producers "$clients" \
		--count "$count" --duration "${seconds}s" --payload-bytes "$payload" --json "$@") || status=1
	if [ "$(field "$out" transport_errors)" != 0 ] || printf '%s' "$out" | grep -q '"refused":{"'; then
		log "not every message was created: $out"
		status=1
	fi
	row "$round" "$build" "$what" "$clients" "$(printf '%.0f' "$(field "$out" envelopes_per_second)")" \
		"$(ms "$(field "$out" p50_ns)")" "$(ms "$(field "$out" p99_ns)")"
	printf '%s %s %s %s\n' "$round" "$build" "$what" "$(field "$out" envelopes_per_second)" >>"$work/rates"
}

: >"$work/rates"
for round in $(seq 1 "$rounds"); do
	for build in "${builds[@]}"; do
		start "$build"
		run "$round" "$build" one-credential 16 --same-credential
		run "$round" "$build" sixteen-credentials 16
		run "$round" "$build" single-one-client 1
		if [ "$build" = current ]; then
			run "$round" "$build" batch-100-one-client 1 --batch 100
		fi
	done
done
stop_pidfile "$pidfile" ingest-api

echo
echo "ingest-api outbox enqueue over loopback HTTP ($(date -u +%Y-%m-%dT%H:%MZ), ${seconds}s per run, payload ${payload} B)"
printf '%s\n' "${rows[@]}"
echo
echo "ratios per round (same build, same round):"
awk '
	{ rate[$1" "$2" "$3] = $4; seen[$1" "$2] = 1 }
	END {
		for (k in seen) {
			one = rate[k" one-credential"]; sixteen = rate[k" sixteen-credentials"]
			single = rate[k" single-one-client"]; batch = rate[k" batch-100-one-client"]
			line = sprintf("round/build %s: one/sixteen %.2f", k, (sixteen > 0 ? one / sixteen : 0))
			if (batch != "" && single > 0) line = line sprintf(", batch/single(1 client) %.1f, batch/single(16 same) %.1f", batch / single, (one > 0 ? batch / one : 0))
			print line
		}
	}' "$work/rates" | sort
exit "$status"
