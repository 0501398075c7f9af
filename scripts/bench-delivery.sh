#!/usr/bin/env bash
# bench-delivery.sh — delivery-worker draining a backlog to a loopback sink, next to a raw store loop
# (Claim 100 + SettleBatch delivered, no HTTP, no signing) over the same rows in the same run.
#
#   scripts/bench-delivery.sh
#   BENCH_MESSAGES=10000      backlog per run (about 1 KiB bodies)
#   BENCH_WORKERS="1 2"       worker processes per run (one run each, fresh database each)
#   BENCH_CONCURRENCY=200     DELIVERY_CONCURRENCY of each worker (2x the claim: the next claim of 100
#                             goes out while the previous 100 are sent)
#   BENCH_SHARES="default"    DELIVERY_TENANT_MAX_INFLIGHT values, each its own run: "default" (unset: a
#                             quarter of the concurrency), "off" (= the concurrency) or a number
#   BENCH_SINK_LATENCY=0s     how long the sink (River+post's too) holds each request before answering (a Go duration): an
#                             endpoint's own time; 0s answers at once (a loopback endpoint)
#   BENCH_POLL=10ms           DELIVERY_POLL_INTERVAL of each worker (due tenants are listed again at most
#                             every min(this, 100ms); the worker's default is 500ms)
#   BENCH_ROUNDS=1            rounds; each round runs every worker count and share once, in order, so
#                             compared settings alternate on a machine whose load drifts
#   BENCH_RIVER=1             also run River on jobs with ~1 KiB arguments, one run per BENCH_RIVER_WORK
#                             kind once a round, after the workers (tools/loadgen-river: as many River
#                             workers as DELIVERY_CONCURRENCY, FetchPollInterval BENCH_POLL, the same
#                             backlog size): the reference of issue 14 (one worker >= 1.0x River). 0 skips it.
#   BENCH_RIVER_WORK="noop"   what River's jobs do, each listed kind its own River run: "noop" (row "River")
#                             or "post" (row "River+post": each job POSTs its ~1 KiB args, signed as the
#                             worker signs, to a loopback sink in River's process), so "River+post" minus
#                             "River" is the HTTP delivery's cost and the rest is the queue's
#   BENCH_BASELINE=           a git revision: also build delivery-worker as of it and run it before the
#                             current build for every worker count and share of a round (rows "W@base"),
#                             so a change is measured against its baseline in the same run
#                             (BENCH_BASELINE_REV is the same setting under its earlier name)
#   BENCH_LOG_LEVEL=warn      LOG_LEVEL of each worker; info writes the line each settled attempt logs
#                             (discarded), as a production worker does
#   BENCH_PROFILE_DIR=        when set, each worker run writes the first worker's CPU profile of the drain
#                             and, if the server preloads pg_stat_statements, the drain's statements, to
#                             DIR/round-R-workers-W-share-S/ (loadgen-delivery --profile-dir)
#
#   BENCH_SHARES="default off" BENCH_WORKERS=1 BENCH_ROUNDS=5 scripts/bench-delivery.sh
#                             one tenant against a fast sink with the tenant share on and off
#
# Each row also says where the CPU went, per message, over that run's drain (from just before the
# workers start to the last message settled; for River from its client's start to the last job
# completed): "cpu us/msg" is worker+sink+pg µs of CPU per message for worker rows (the worker
# processes; loadgen-delivery's own process, that is the loopback sink and its bookkeeping; every
# postgres process of the server) and river+pg per job for River rows (River's process: client and
# workers, and for River+post its sink too; the server), and "cores" is that CPU over the window's
# wall time. The server's figure is the whole server's: another load on it during the run counts too.
# "-" where /proc is not readable (or, for pg, no postgres process runs on this machine). See
# tools/internal/proccpu.
#
# It ensures PostgreSQL (scripts/pg.sh), builds envctl, delivery-worker and loadgen-delivery into
# .tmp/bin, and for each worker count makes a fresh database envelopeworker_bench_delivery, migrates it
# and runs loadgen-delivery (see tools/internal/loaddelivery); the database is dropped on exit.
set -euo pipefail
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

messages=${BENCH_MESSAGES:-10000}
workers_list=${BENCH_WORKERS:-"1 2"}
concurrency=${BENCH_CONCURRENCY:-200}
shares=${BENCH_SHARES:-default}
rounds=${BENCH_ROUNDS:-1}
poll=${BENCH_POLL:-10ms}
sink_latency=${BENCH_SINK_LATENCY:-0s}
river=${BENCH_RIVER:-1}
river_work=${BENCH_RIVER_WORK:-noop}
baseline=${BENCH_BASELINE:-${BENCH_BASELINE_REV:-}}
log_level=${BENCH_LOG_LEVEL:-warn}
profile_dir=${BENCH_PROFILE_DIR:-}
for s in $shares; do
	case $s in
	default | off) ;;
	*) [[ $s =~ ^[0-9]+$ ]] && [ "$s" -ge 1 ] && [ "$s" -le "$concurrency" ] ||
		die "BENCH_SHARES: $s is not default, off or 1..$concurrency" ;;
	esac
done
[[ $rounds =~ ^[0-9]+$ ]] && [ "$rounds" -ge 1 ] || die "BENCH_ROUNDS must be a positive integer"
[[ $sink_latency =~ ^[0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h)$ ]] || die "BENCH_SINK_LATENCY: $sink_latency is not a Go duration such as 0s or 5ms"
[ -n "${river_work// /}" ] || die "BENCH_RIVER_WORK lists no kind (noop, post)"
for k in $river_work; do
	case $k in
	noop | post) ;;
	*) die "BENCH_RIVER_WORK: $k is not noop or post" ;;
	esac
done
need psql "install the PostgreSQL client (Debian: postgresql-client)"
need go "install Go 1.26"

started_pg=0
admin=""
db=envelopeworker_bench_delivery_$$ # per run: several runs may share one server
cleanup() {
	release_pg "$db" 0
}
trap cleanup EXIT

use_pg
mkdir -p "$bindir"
log "building envctl, delivery-worker and loadgen-delivery into .tmp/bin"
(cd "$root" && go build -o "$bindir/envctl" ./tools/envctl) || die "go build envctl failed"
(cd "$root" && go build -o "$bindir/delivery-worker" ./services/delivery-worker) || die "go build delivery-worker failed"
(cd "$root" && go build -o "$bindir/loadgen-delivery" ./tools/loadgen-delivery) || die "go build loadgen-delivery failed"
builds=(current)
if [ -n "$baseline" ]; then
	build_at_rev "$baseline" ./services/delivery-worker "$bindir/delivery-worker-baseline"
	builds=(baseline current)
fi
if [ "$river" = 1 ]; then
	# Its own module, outside go.work: River's dependencies stay out of the services'.
	# Building it may need its modules downloaded: without them the worker runs are still worth having.
	if ! (cd "$root/tools/loadgen-river" && GOWORK=off go build -o "$bindir/loadgen-river" .); then
		log "go build loadgen-river failed: no River comparison this run (BENCH_RIVER=0 skips the attempt)"
		river=0
	fi
fi

field() { printf '%s' "$1" | sed -n -E 's/.*"'"$2"'":"?([0-9.e+-]+).*/\1/p'; }
# dash JSON FIELD: field, or "-" when absent.
dash() {
	local v
	v=$(field "$1" "$2")
	printf '%s' "${v:--}"
}
# cpu JSON FIELD...: the fields rounded to whole µs and joined by "+", "-" for an absent one.
cpu() {
	local out=$1 f v parts=()
	shift
	for f in "$@"; do
		v=$(field "$out" "$f")
		if [ -n "$v" ]; then parts+=("$(printf '%.0f' "$v")"); else parts+=(-); fi
	done
	local IFS=+
	printf '%s' "${parts[*]}"
}
rows=()
row() { rows+=("$(printf '%-6s %-10s %-8s %12s %14s %8s %9s %9s %9s %9s %16s %6s %6s' "$@")"); }
row "round" "workers" "share" "raw rows/s" "worker msgs/s" "ratio" "sink max" "p50 ms" "p99 ms" "max ms" "cpu us/msg" "cores" "load"
for r in $(seq "$rounds"); do
	for w in $workers_list; do
		for s in $shares; do
			case $s in
			default) share=0 ;;
			off) share=$concurrency ;;
			*) share=$s ;;
			esac
			for b in "${builds[@]}"; do
				bin=$bindir/delivery-worker label=$w
				if [ "$b" = baseline ]; then bin=$bindir/delivery-worker-baseline label=$w@base; fi
				fresh_db "$admin" "$db"
				dsn=$(dsn_with_db "$admin" "$db")
				"$bindir/envctl" migrate --database-url "$dsn" >&2
				log "round $r: $w worker(s) ($b), $messages messages, concurrency $concurrency, tenant share $s"
				prof=()
				if [ -n "$profile_dir" ]; then prof=(--profile-dir "$profile_dir/round-$r-workers-$w-share-$s-$b"); fi
				out=$("$bindir/loadgen-delivery" --database-url "$dsn" --worker-bin "$bin" \
					--workers "$w" --concurrency "$concurrency" --tenant-max-inflight "$share" --poll-interval "$poll" --messages "$messages" --sink-latency "$sink_latency" \
					--worker-log-level "$log_level" ${prof[@]+"${prof[@]}"})
				log "$out"
				row "$r" "$label" "$s" "$(printf '%.0f' "$(field "$out" raw_rows_per_second)")" \
					"$(printf '%.0f' "$(field "$out" worker_deliveries_per_second)")" \
					"$(printf '%.2f' "$(field "$out" worker_vs_raw)")" "$(field "$out" sink_max_in_flight)" \
					"$(field "$out" latency_p50_ms)" "$(field "$out" latency_p99_ms)" "$(field "$out" latency_max_ms)" \
					"$(cpu "$out" worker_cpu_us_per_message sink_cpu_us_per_message postgres_cpu_us_per_message)" \
					"$(dash "$out" cpu_cores_busy)" "$(field "$out" load_average_1m)"
			done
		done
	done
	if [ "$river" = 1 ]; then
		for k in $river_work; do
			label=River
			if [ "$k" = post ]; then label=River+post; fi
			fresh_db "$admin" "$db"
			dsn=$(dsn_with_db "$admin" "$db")
			log "round $r: $label, $messages $k jobs, $concurrency workers"
			out=$("$bindir/loadgen-river" --database-url "$dsn" --jobs "$messages" --workers "$concurrency" --poll-interval "$poll" \
				--work "$k" --sink-latency "$sink_latency")
			log "$out"
			row "$r" "$label" "-" "-" "$(printf '%.0f' "$(field "$out" river_jobs_per_second)")" "-" "-" "-" "-" "-" \
				"$(cpu "$out" river_cpu_us_per_job postgres_cpu_us_per_job)" "$(dash "$out" cpu_cores_busy)" \
				"$(field "$out" load_average_1m)"
		done
	fi
done

echo
echo "delivery-worker backlog drain vs raw Claim+SettleBatch; cpu us/msg: worker+sink+pg, River: river+pg ($(date -u +%Y-%m-%dT%H:%MZ), $messages messages, concurrency $concurrency, poll $poll, sink latency $sink_latency, shares: $shares, LOG_LEVEL $log_level${baseline:+, baseline $baseline})"
printf '%s\n' "${rows[@]}"
