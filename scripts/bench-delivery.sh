#!/usr/bin/env bash
# bench-delivery.sh — delivery-worker draining a backlog to a loopback sink, next to a raw store loop
# (Claim 100 + SettleBatch delivered, no HTTP, no signing) over the same rows in the same run.
#
#   scripts/bench-delivery.sh
#   BENCH_MESSAGES=10000      backlog per run (about 1 KiB bodies)
#   BENCH_WORKERS="1 2"       worker processes per run (one run each, fresh database each)
#   BENCH_CONCURRENCY=200     DELIVERY_CONCURRENCY of each worker (2x the claim: the next claim of 100
#                             goes out while the previous 100 settle)
#   BENCH_SHARES="default"    DELIVERY_TENANT_MAX_INFLIGHT values, each its own run: "default" (unset: a
#                             quarter of the concurrency), "off" (= the concurrency) or a number
#   BENCH_POLL=10ms           DELIVERY_POLL_INTERVAL of each worker (due tenants are listed again at most
#                             every min(this, 100ms); the worker's default is 500ms)
#   BENCH_ROUNDS=1            rounds; each round runs every worker count and share once, in order, so
#                             compared settings alternate on a machine whose load drifts
#
#   BENCH_LOG_LEVEL=warn      LOG_LEVEL of each worker; info writes the line each settled attempt logs
#                             (discarded), as a production worker does
#   BENCH_BASELINE_REV=""     a git revision: also build delivery-worker from it (its tree exported
#                             with git archive into a temporary directory) and run every setting with both binaries, in alternating
#                             order (baseline first in odd rounds, this tree first in even ones), on
#                             the same schema; the "build" column tells them apart
#
#   BENCH_SHARES="default off" BENCH_WORKERS=1 BENCH_ROUNDS=5 scripts/bench-delivery.sh
#                             one tenant against a fast sink with the tenant share on and off
#   BENCH_BASELINE_REV=HEAD~3 BENCH_WORKERS=1 BENCH_ROUNDS=4 scripts/bench-delivery.sh
#                             this tree's worker against an earlier one's, same run
#
# It ensures PostgreSQL (scripts/pg.sh), builds envctl, delivery-worker and loadgen-delivery into
# .tmp/bin, and for each worker count makes a fresh database envelopeworker_bench_delivery, migrates it
# and runs loadgen-delivery (see tools/internal/loaddelivery); the database is dropped on exit.
set -euo pipefail
script_name=bench-delivery.sh
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

messages=${BENCH_MESSAGES:-10000}
workers_list=${BENCH_WORKERS:-"1 2"}
concurrency=${BENCH_CONCURRENCY:-200}
shares=${BENCH_SHARES:-default}
rounds=${BENCH_ROUNDS:-1}
poll=${BENCH_POLL:-10ms}
baseline_rev=${BENCH_BASELINE_REV:-}
log_level=${BENCH_LOG_LEVEL:-warn}
for s in $shares; do
	case $s in
	default | off) ;;
	*) [[ $s =~ ^[0-9]+$ ]] && [ "$s" -ge 1 ] && [ "$s" -le "$concurrency" ] ||
		die "BENCH_SHARES: $s is not default, off or 1..$concurrency" ;;
	esac
done
[[ $rounds =~ ^[0-9]+$ ]] && [ "$rounds" -ge 1 ] || die "BENCH_ROUNDS must be a positive integer"
need psql "install the PostgreSQL client (Debian: postgresql-client)"
need go "install Go 1.26"

started_pg=0
admin=""
db=envelopeworker_bench_delivery
baseline_tree=""
cleanup() {
	if [ -n "$baseline_tree" ]; then rm -rf "$baseline_tree"; fi
	if [ -n "$admin" ]; then
		PGOPTIONS="-c client_min_messages=warning" psql "$admin" -XqAt -c "DROP DATABASE IF EXISTS $db WITH (FORCE)" >/dev/null 2>&1 || true
	fi
	if [ "$started_pg" = 1 ]; then "$root/scripts/pg.sh" stop; fi
}
trap cleanup EXIT

pgenv=$("$root/scripts/pg.sh") || die "scripts/pg.sh could not provide a PostgreSQL"
eval "$pgenv"
started_pg=${PG_STARTED_BY_US:-0}
check_url_dsn "$TEST_DATABASE_URL"
admin=$TEST_DATABASE_URL
mkdir -p "$bindir"
log "building envctl, delivery-worker and loadgen-delivery into .tmp/bin"
(cd "$root" && go build -o "$bindir/envctl" ./tools/envctl) || die "go build envctl failed"
(cd "$root" && go build -o "$bindir/delivery-worker" ./services/delivery-worker) || die "go build delivery-worker failed"
(cd "$root" && go build -o "$bindir/loadgen-delivery" ./tools/loadgen-delivery) || die "go build loadgen-delivery failed"
builds="this"
if [ -n "$baseline_rev" ]; then
	need git "install git"
	rev=$(git -C "$root" rev-parse --verify "$baseline_rev^{commit}") || die "BENCH_BASELINE_REV: $baseline_rev is not a commit"
	baseline_tree=$(mktemp -d)
	git -C "$root" archive "$rev" | tar -x -C "$baseline_tree" || die "git archive $rev failed"
	log "building delivery-worker of ${rev:0:12} into .tmp/bin/delivery-worker-baseline"
	(cd "$baseline_tree" && GOWORK="$baseline_tree/go.work" go build -o "$bindir/delivery-worker-baseline" ./services/delivery-worker) ||
		die "go build delivery-worker at $rev failed"
	rm -rf "$baseline_tree"
	baseline_tree=""
fi

field() { printf '%s' "$1" | sed -n -E 's/.*"'"$2"'":"?([0-9.e+-]+).*/\1/p'; }
rows=()
row() { rows+=("$(printf '%-6s %-9s %-8s %-8s %12s %14s %8s %9s %9s %9s %9s %6s' "$@")"); }
row "round" "build" "workers" "share" "raw rows/s" "worker msgs/s" "ratio" "sink max" "p50 ms" "p99 ms" "max ms" "load"
for r in $(seq "$rounds"); do
	order=$builds
	if [ -n "$baseline_rev" ]; then
		if [ $((r % 2)) = 1 ]; then order="baseline this"; else order="this baseline"; fi
	fi
	for w in $workers_list; do
		for s in $shares; do
			case $s in
			default) share=0 ;;
			off) share=$concurrency ;;
			*) share=$s ;;
			esac
			for b in $order; do
				bin="$bindir/delivery-worker"
				if [ "$b" = baseline ]; then bin="$bindir/delivery-worker-baseline"; fi
				fresh_db "$admin" "$db"
				dsn=$(dsn_with_db "$admin" "$db")
				"$bindir/envctl" migrate --database-url "$dsn" >&2
				log "round $r: $b build, $w worker(s), $messages messages, concurrency $concurrency, tenant share $s"
				out=$("$bindir/loadgen-delivery" --database-url "$dsn" --worker-bin "$bin" \
					--workers "$w" --concurrency "$concurrency" --tenant-max-inflight "$share" --poll-interval "$poll" --messages "$messages" --worker-log-level "$log_level")
				log "$out"
				row "$r" "$b" "$w" "$s" "$(printf '%.0f' "$(field "$out" raw_rows_per_second)")" \
					"$(printf '%.0f' "$(field "$out" worker_deliveries_per_second)")" \
					"$(printf '%.2f' "$(field "$out" worker_vs_raw)")" "$(field "$out" sink_max_in_flight)" \
					"$(field "$out" latency_p50_ms)" "$(field "$out" latency_p99_ms)" "$(field "$out" latency_max_ms)" \
					"$(field "$out" load_average_1m)"
			done
		done
	done
done

echo
echo "delivery-worker backlog drain vs raw Claim+SettleBatch ($(date -u +%Y-%m-%dT%H:%MZ), $messages messages, concurrency $concurrency, poll $poll, shares: $shares, LOG_LEVEL $log_level${baseline_rev:+, baseline ${rev:0:12}})"
printf '%s\n' "${rows[@]}"
