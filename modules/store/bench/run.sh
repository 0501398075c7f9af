#!/bin/sh
# Runs the store's Go ingest benchmarks and pgbench with the same statements
# (bench/ingest.pgbench, generated from the store's SQL) against one fresh
# database on the same server, interleaved at each concurrency so both see the
# same machine load, and prints both. Usage, from anywhere:
#   sh modules/store/bench/run.sh            (or: make -C modules/store bench-store)
# Environment: TEST_DATABASE_URL (admin URL, default
# postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable), BENCH_SECONDS
# (per slice, default 5), BENCH_ROUNDS (default 6).
set -eu
cd "$(dirname "$0")/.."

admin=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
seconds=${BENCH_SECONDS:-5}
rounds=${BENCH_ROUNDS:-6}
pgbench=$(command -v pgbench || true)
if [ -z "$pgbench" ]; then
	pgbench="$(pg_config --bindir)/pgbench"
fi
cpus=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1)

db=envelopeworker_store_bench_$$
tmp=$(mktemp -d)
dsn=$(printf '%s' "$admin" | sed "s#^\([a-z]*://[^/]*\)/[^?]*#\1/$db#")
psql "$admin" -qc "CREATE DATABASE $db"
trap 'psql "$admin" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)"; rm -rf "$tmp"' EXIT INT TERM
go test -c -o "$tmp/store.test" .

gobench() { # $1: benchmark pattern; prints envelopes/s
	STORE_BENCH_DSN=$dsn "$tmp/store.test" -test.run '^$' -test.bench "$1" \
		-test.benchtime "${seconds}s" -test.count 1 |
		awk '{for (i = 2; i <= NF; i++) if ($i == "envelopes/s") print $(i - 1)}'
}

pgb() { # $1: clients; prints tps
	j=$1
	if [ "$j" -gt "$cpus" ]; then j=$cpus; fi
	"$pgbench" -n -M prepared -f bench/ingest.pgbench -D run="$$$round$1" -D seq=0 \
		-c "$1" -j "$j" -T "$seconds" "$dsn" 2>/dev/null |
		awk '/^tps/ {print $3}'
}

settle() { psql "$admin" -qc CHECKPOINT; }

# Short interleaved slices, many rounds: on a shared machine the load changes
# by the minute, and alternating spreads it evenly over both sides.
echo "round concurrency store_envelopes_per_s pgbench_tps batch100_envelopes_per_s"
: >"$tmp/rows"
round=1
while [ "$round" -le "$rounds" ]; do
	for c in 1 4 16; do
		# Batches write a lot of WAL; a checkpoint before each slice keeps
		# one side from paying for the other's dirty pages, and the order
		# alternates so neither always runs first.
		if [ $((round % 2)) -eq 1 ]; then
			settle; single=$(gobench "BenchmarkIngest\$/^producers=$c\$")
			settle; tps=$(pgb "$c")
		else
			settle; tps=$(pgb "$c")
			settle; single=$(gobench "BenchmarkIngest\$/^producers=$c\$")
		fi
		settle; batch=$(gobench "BenchmarkIngestBatch\$/^producers=$c\$/")
		echo "$round $c $single $tps $batch" | tee -a "$tmp/rows"
	done
	round=$((round + 1))
done
echo
echo "concurrency mean_store_envelopes_per_s mean_pgbench_tps store/pgbench mean_batch100_envelopes_per_s batch/single"
awk '{ s[$2] += $3; p[$2] += $4; b[$2] += $5; n[$2]++ }
	END { for (c in n) printf "%s %.1f %.1f %.2f %.1f %.1f\n", c, s[c] / n[c], p[c] / n[c], s[c] / p[c], b[c] / n[c], b[c] / s[c] }' \
	"$tmp/rows" | sort -n
