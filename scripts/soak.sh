#!/usr/bin/env bash
# soak.sh — the whole stack at a steady rate for a long time (`make soak`; issue 7): memory, goroutines,
# open descriptors, database connections and latency must stay flat. Prints one row per sample, a table
# of first- against last-quarter medians, and a verdict; exits 1 when something grew or failed.
#
#   SOAK_DURATION=20m        how long the load runs (Ns, Nm, Nh or plain seconds)
#   SOAK_INTERVAL=30         seconds per sample: one load generator run per interval, so each sample has
#                            the latency of its own interval (p50/p99 counted from when a request was due)
#   SOAK_RATE=150            envelopes/s on the single route (the load generator, fresh streams per run)
#   SOAK_PRODUCERS=8         concurrent producers, one request in flight each
#   SOAK_PAYLOAD_BYTES=600   padding per payload (about 1 KiB signed envelopes)
#   SOAK_OUTBOX_EVERY=0.5    seconds between POST /v1/outbox enqueues (delivered to a local webhook-sink)
#   SOAK_RETENTION=2m        ingest-api's PAYLOAD_RETENTION, so the janitor always has expired payloads
#   SOAK_JANITOR_EVERY=60    seconds between retention-janitor runs (each run deletes what expired)
#   SOAK_WARMUP=60           seconds of samples left out of the verdict (pools, caches, heap growing to
#                            its working size)
#   SOAK_VACUUM=auto         after each janitor run, VACUUM ANALYZE the soak database as the admin: auto
#                            does it only when the server runs with autovacuum off (a CI configuration;
#                            production runs autovacuum, and without it the janitor's deletes and the
#                            cursor updates pile up as dead rows), on always, off never
#   SOAK_KEEP_DB=1           keep the envelopeworker_soak database (dropped by default)
#
# It ensures PostgreSQL (scripts/pg.sh), makes a fresh database envelopeworker_soak, migrates it, builds
# the binaries into .tmp/bin, and starts on free loopback ports: ingest-api (as envelopeworker_ingest when
# the server lets that role in, else the admin DSN), a webhook-sink that checks signatures, and
# delivery-worker (as envelopeworker_delivery). pg_stat_activity tells the binaries' connections apart
# by the application_name each sets (envelopeworker for ingest-api, the only one left running that uses
# the store's default; delivery-worker; retention-janitor), whatever role they log in as. Every SOAK_INTERVAL seconds the sampler reads, half-way through the interval's load
# run: process_resident_memory_bytes, go_memstats_heap_inuse_bytes, go_goroutines and process_open_fds of
# ingest-api and delivery-worker from their /metrics; the sink's VmRSS from /proc; the connections per
# application_name; the payload rows held; the worker's due backlog. The verdict compares, for each
# figure, the median of the last quarter of the samples after the warm-up with the median of the first
# quarter, allowing the growth given below (relative or absolute, whichever is larger); it also fails on
# any envelope not accepted, any enqueue not answered 201, any janitor run that failed, or any message not
# delivered within 60 s of the end. Everything it started stops on exit, by pid. Every wait is bounded.
set -euo pipefail
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

duration_raw=${SOAK_DURATION:-20m}
interval=${SOAK_INTERVAL:-30}
rate=${SOAK_RATE:-150}
producers=${SOAK_PRODUCERS:-8}
payload=${SOAK_PAYLOAD_BYTES:-600}
outbox_every=${SOAK_OUTBOX_EVERY:-0.5}
retention=${SOAK_RETENTION:-2m}
janitor_every=${SOAK_JANITOR_EVERY:-60}
warmup=${SOAK_WARMUP:-60}
vacuum=${SOAK_VACUUM:-auto}
case "$vacuum" in auto | on | off) ;; *) die "SOAK_VACUUM must be auto, on or off (got '$vacuum')" ;; esac

case "$duration_raw" in
*h) duration=$((${duration_raw%h} * 3600)) ;;
*m) duration=$((${duration_raw%m} * 60)) ;;
*s) duration=${duration_raw%s} ;;
*) duration=$duration_raw ;;
esac
for v in duration interval rate producers payload janitor_every warmup; do
	case "${!v}" in '' | *[!0-9]*) die "$v must be a whole number (got '${!v}')" ;; esac
done
case "$outbox_every" in '' | *[!0-9.]*) die "SOAK_OUTBOX_EVERY must be a number of seconds (got '$outbox_every')" ;; esac
[ "$interval" -ge 10 ] || die "SOAK_INTERVAL must be at least 10 seconds"
[ "$duration" -ge $((interval * 4)) ] || die "SOAK_DURATION must cover at least 4 intervals"
[ "$rate" -ge 1 ] && [ "$producers" -ge 1 ] && [ "$janitor_every" -ge 1 ] || die "rate, producers and janitor interval must be at least 1"
need psql "install the PostgreSQL client (Debian: postgresql-client)"
need curl "install curl"
need timeout "install coreutils"

# Allowed growth, last-quarter median over first-quarter median: relative, or absolute, whichever is larger.
tol_rss_rel=0.20 tol_rss_mib=8        # resident memory
tol_heap_rel=0.25 tol_heap_mib=4      # Go heap in use
tol_gor_rel=0.20 tol_gor_abs=10       # goroutines
tol_fd_rel=0.20 tol_fd_abs=10         # open file descriptors (sockets included)
tol_conn_abs=2                        # database connections of one binary
tol_p50_rel=0.50 tol_p50_ms=2         # latency: a shared 2-vCPU machine is noisy
tol_p99_rel=0.50 tol_p99_ms=10

umask 077
work="$tmp/soak"
rm -rf "$work"
mkdir -p "$work"
chmod 700 "$work"
db=envelopeworker_soak
admin=""
started_pg=0
loadgen_pid=""
janitor_loop_pid=""
outbox_loop_pid=""
cleanup() {
	for p in $loadgen_pid $janitor_loop_pid $outbox_loop_pid; do kill -TERM "$p" 2>/dev/null || true; done
	stop_pidfile "$work/delivery-worker.pid" delivery-worker
	stop_pidfile "$work/webhook-sink.pid" webhook-sink
	stop_pidfile "$work/ingest-api.pid" ingest-api
	rm -f "$work/creds.json" "$work/service.token" "$work/service.header" "$work/outbound.seed" \
		"$work/outbound-keys.json" "$work/webhook.secret" "$work/webhook-secrets.json"
	release_pg "$db" "${SOAK_KEEP_DB:-0}"
}
trap cleanup EXIT
trap 'exit 143' TERM INT

loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }
load_start=$(loadavg)

use_fresh_db "$db"
build_stack_bins
log "building retention-janitor into .tmp/bin"
(cd "$root" && go build -o "$bindir/retention-janitor" ./services/retention-janitor) || die "go build retention-janitor failed"
envctl="$bindir/envctl"
"$envctl" migrate --database-url "$dsn" --timeout 2m >&2

role_dsn() { # role_dsn ROLE -> a DSN as ROLE when the server lets it in without a password, else the admin's
	local d
	d=$(dsn_with_user "$dsn" "$1")
	if answers "$d"; then printf '%s' "$d"; else printf '%s' "$dsn"; fi
}
ingest_dsn=$(role_dsn envelopeworker_ingest)
worker_dsn=$(role_dsn envelopeworker_delivery)
janitor_dsn=$(role_dsn envelopeworker_janitor)
psql_admin() { psql "$dsn" -XqAt -v ON_ERROR_STOP=1 "$@"; }
autovacuum=$(psql_admin -c "SHOW autovacuum")
if [ "$vacuum" = auto ]; then
	vacuum=off
	[ "$autovacuum" = on ] || vacuum=on
fi
log "server autovacuum: $autovacuum; VACUUM ANALYZE after each janitor run: $vacuum"

# The outbox half: a service credential, the tenant's outbound key, an endpoint at the sink.
tenant=soak service=svc-soak out_key_id=soak-out-1 secret_ref=soak-hooks project=p-soak topic=soak.events
"$envctl" credential issue --database-url "$dsn" --tenant "$tenant" --account acct-soak --device "$service" \
	--role service >"$work/service.token" 2>/dev/null || die "credential issue (service) failed"
printf 'Authorization: Bearer %s\n' "$(cat "$work/service.token")" >"$work/service.header"
out_pub=$("$envctl" keygen --seed-file "$work/outbound.seed")
printf '{"%s":{"key_id":"%s","seed":"%s"}}\n' "$tenant" "$out_key_id" "$(tr -d '\n' <"$work/outbound.seed")" \
	>"$work/outbound-keys.json"
secret="whsec_$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
printf '%s\n' "$secret" >"$work/webhook.secret"
printf '{"%s":["%s"]}\n' "$secret_ref" "$secret" >"$work/webhook-secrets.json"
unset secret

port=$(free_port 18380)
mport=$(free_port $((port + 1)))
sport=$(free_port $((mport + 1)))
wport=$(free_port $((sport + 1)))
url="http://127.0.0.1:$port"
imetrics="http://127.0.0.1:$mport/metrics"
sink_url="http://127.0.0.1:$sport/hooks"
wmetrics="http://127.0.0.1:$wport/metrics"

# Limiters opened wide (as the bench scripts): at a fixed rate, a producer that fell behind during a stall
# catches up back to back, which the default 100/s per device would refuse; the soak is not a limiter test.
log "starting ingest-api on $url (PAYLOAD_RETENTION=$retention)"
(
	export DATABASE_URL="$ingest_dsn" INGEST_ADDR="127.0.0.1:$port" METRICS_ADDR="127.0.0.1:$mport" \
		PAYLOAD_RETENTION="$retention" OUTBOUND_SIGNING_KEYS_FILE="$work/outbound-keys.json" LOG_LEVEL=warn \
		SYNC_LIMIT_TOKENS=1000000 SYNC_LIMIT_INTERVAL=1s PEER_LIMIT_TOKENS=1000000 PEER_LIMIT_INTERVAL=1s
	start_ingest "$work/ingest-api.pid" "$work/ingest-api.log"
)
wait_ready "$url" "$work/ingest-api.pid" "$work/ingest-api.log" 60
start_bg webhook-sink "$work/webhook-sink.pid" "$work/webhook-sink.log" --addr "127.0.0.1:$sport" \
	--secret-file "$work/webhook.secret" --envelope-public-key "$out_pub"
wait_http "$sink_url" webhook-sink "$work/webhook-sink.pid" "$work/webhook-sink.log" 30
(
	export DATABASE_URL="$worker_dsn" METRICS_ADDR="127.0.0.1:$wport" WEBHOOK_SECRETS_FILE="$work/webhook-secrets.json" \
		DELIVERY_ALLOW_INSECURE_LOOPBACK=true DELIVERY_POLL_INTERVAL=200ms LOG_LEVEL=warn
	start_bg delivery-worker "$work/delivery-worker.pid" "$work/delivery-worker.log"
)
wait_http "http://127.0.0.1:$wport/readyz" delivery-worker "$work/delivery-worker.pid" "$work/delivery-worker.log" 60 ok
"$envctl" endpoint add --database-url "$dsn" --tenant "$tenant" --project "$project" --topic "$topic" \
	--url "$sink_url" --secret-ref "$secret_ref" >/dev/null || die "endpoint add failed"
"$bindir/loadgen-ingest" setup --database-url "$dsn" --producers "$producers" --out "$work/creds.json" >&2

ingest_pid=$(cat "$work/ingest-api.pid")
worker_pid=$(cat "$work/delivery-worker.pid")
sink_pid=$(cat "$work/webhook-sink.pid")
start=$(date +%s)
end=$((start + duration))

# The janitor: one run every janitor_every seconds until the end, each bounded; summary lines kept.
(
	trap 'exit 0' TERM
	n=0
	while [ "$(date +%s)" -lt "$end" ]; do
		n=$((n + 1))
		rc=0
		DATABASE_URL="$janitor_dsn" JANITOR_TIMEOUT=50s LOG_LEVEL=info \
			timeout 55 "$bindir/retention-janitor" >"$work/janitor.run" 2>&1 || rc=$?
		{ grep '"msg":"retention summary"' "$work/janitor.run" || echo '{"msg":"no summary"}'; } |
			tail -n 1 | sed "s/^/$n $rc /" >>"$work/janitor.summaries"
		if [ "$vacuum" = on ]; then
			t0=$(date +%s.%N)
			vrc=0
			timeout 50 psql "$dsn" -XqAt -c "VACUUM (ANALYZE)" >/dev/null 2>&1 || vrc=$?
			awk -v a="$t0" -v b="$(date +%s.%N)" -v rc="$vrc" 'BEGIN { printf "%.2f %d\n", b - a, rc }' >>"$work/vacuum.runs"
		fi
		sleep "$janitor_every" & wait $!
	done
) &
janitor_loop_pid=$!

# The outbox: one enqueue every outbox_every seconds until the end; every answer's status recorded.
(
	trap 'exit 0' TERM
	n=0
	while [ "$(date +%s)" -lt "$end" ]; do
		n=$((n + 1))
		code=$(curl -sS -o /dev/null -w '%{http_code}' --max-time 10 -H "@$work/service.header" \
			-H 'Content-Type: application/json' -X POST \
			--data-binary '{"project_id":"'"$project"'","topic":"'"$topic"'","idempotency_key":"soak-'"$n"'","kind":"soak.event","payload":{"n":'"$n"'}}' \
			"$url/v1/outbox" 2>/dev/null) || code=000
		echo "$code" >>"$work/outbox.codes"
		sleep "$outbox_every" & wait $!
	done
) &
outbox_loop_pid=$!

# metric TEXT NAME -> the value of an unlabelled metric line (0 when absent).
metric() { printf '%s\n' "$1" | awk -v n="$2" '$1 == n { v = $2 } END { printf "%.0f", v + 0 }'; }
conns() { # conns -> "ingest worker janitor" connection counts to the soak database
	psql_admin -F ' ' -c "SELECT count(*) FILTER (WHERE application_name = 'envelopeworker'),
		count(*) FILTER (WHERE application_name = 'delivery-worker'), count(*) FILTER (WHERE application_name = 'retention-janitor')
		FROM pg_stat_activity WHERE datname = '$db'"
}
field() { printf '%s' "$1" | sed -n -E 's/.*"'"$2"'":"?([0-9A-Za-z_.e+-]+)"?.*/\1/p' | head -n 1; }
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status" 2>/dev/null || echo 0; }

samples="$work/samples.tsv"
printf 't_s\ti_rss_mib\ti_heap_mib\ti_gor\ti_fds\tw_rss_mib\tw_heap_mib\tw_gor\tw_fds\tsink_rss_mib\tc_ingest\tc_worker\tc_janitor\tpayload_rows\tdue\tsent\tenv_s\tp50_ms\tp99_ms\tload1\n' >"$samples"
status=0
not_accepted=0
accepted_total=0
unsent=0
i=0
log "soak: ${rate} env/s from $producers producers, an enqueue every ${outbox_every}s, janitor every ${janitor_every}s, for ${duration}s; a sample every ${interval}s"
printf '%s\n' "$(head -n 1 "$samples")" >&2
while [ "$(date +%s)" -lt "$end" ]; do
	i=$((i + 1))
	out="$work/run$i.json"
	timeout $((interval + 120)) "$bindir/loadgen-ingest" run --url "$url" --creds "$work/creds.json" \
		--producers "$producers" --count $((rate * interval)) --duration "$((interval * 2))s" --rate "$rate" \
		--payload-bytes "$payload" --json >"$out" 2>"$out.err" &
	loadgen_pid=$!
	sleep $((interval / 2))
	im=$(curl -fsS --max-time 5 "$imetrics" 2>/dev/null || true)
	wm=$(curl -fsS --max-time 5 "$wmetrics" 2>/dev/null || true)
	[ -n "$im" ] && [ -n "$wm" ] || { log "sample $i: a /metrics did not answer"; status=1; }
	alive "$work/ingest-api.pid" ingest-api && alive "$work/delivery-worker.pid" delivery-worker ||
		die "a service exited during the soak (logs in ${work#"$root"/})"
	read -r c_i c_w c_j <<<"$(conns)"
	rows=$(psql_admin -c "SELECT count(*) FROM inbound_payloads")
	rc=0
	wait "$loadgen_pid" || rc=$?
	loadgen_pid=""
	rep=$(cat "$out")
	acc=$(field "$rep" accepted)
	sent=$(field "$rep" envelopes)
	acc=${acc:-0} sent=${sent:-0}
	accepted_total=$((accepted_total + acc))
	# Sent but not accepted (a refusal, a transport error) fails the soak; not sent at all means the
	# interval's run fell behind its rate and hit its time cap, which the env/s column shows.
	unsent=$((unsent + rate * interval - sent))
	if [ "$rc" != 0 ] || [ "$acc" != "$sent" ]; then
		log "sample $i: load generator exit $rc, accepted $acc of $sent sent: $(tail -n 2 "$out.err") $(printf '%s' "$rep" | grep -o '"refused":{[^}]*}')"
		not_accepted=$((not_accepted + sent - acc))
		status=1
	fi
	line=$(awk -v t="$(($(date +%s) - start))" \
		-v irss="$(metric "$im" process_resident_memory_bytes)" -v iheap="$(metric "$im" go_memstats_heap_inuse_bytes)" \
		-v igor="$(metric "$im" go_goroutines)" -v ifd="$(metric "$im" process_open_fds)" \
		-v wrss="$(metric "$wm" process_resident_memory_bytes)" -v wheap="$(metric "$wm" go_memstats_heap_inuse_bytes)" \
		-v wgor="$(metric "$wm" go_goroutines)" -v wfd="$(metric "$wm" process_open_fds)" \
		-v srss="$(rss_kb "$sink_pid")" -v ci="$c_i" -v cw="$c_w" -v cj="$c_j" -v rows="$rows" \
		-v due="$(metric "$wm" envelopeworker_delivery_due_messages)" \
		-v la="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)" -v sent="$sent" -v eps="$(field "$rep" envelopes_per_second)" -v p50="$(field "$rep" p50_ns)" -v p99="$(field "$rep" p99_ns)" \
		'BEGIN { m = 1048576; printf "%d\t%.1f\t%.1f\t%d\t%d\t%.1f\t%.1f\t%d\t%d\t%.1f\t%d\t%d\t%d\t%d\t%d\t%d\t%.0f\t%.2f\t%.2f\t%s\n",
			t, irss / m, iheap / m, igor, ifd, wrss / m, wheap / m, wgor, wfd, srss / 1024, ci, cw, cj, rows, due,
			sent, eps, p50 / 1e6, p99 / 1e6, la }')
	printf '%s\n' "$line" >>"$samples"
	printf '%s\n' "$line" >&2
done
kill -TERM "$janitor_loop_pid" "$outbox_loop_pid" 2>/dev/null || true
wait "$janitor_loop_pid" "$outbox_loop_pid" 2>/dev/null || true
janitor_loop_pid="" outbox_loop_pid=""

# Every enqueued message delivered (bounded wait for the tail of the backlog).
enqueued=$(grep -c '^201$' "$work/outbox.codes" || true)
bad_codes=$(grep -vc '^201$' "$work/outbox.codes" || true)
for _ in $(seq 1 120); do
	left=$(psql_admin -c "SELECT count(*) FROM outbox_messages WHERE status IN ('pending', 'delivering')")
	[ "$left" = 0 ] && break
	sleep 0.5
done
read -r delivered dead left <<<"$(psql_admin -F ' ' -c "SELECT count(*) FILTER (WHERE status = 'delivered'),
	count(*) FILTER (WHERE status = 'dead'), count(*) FILTER (WHERE status IN ('pending', 'delivering')) FROM outbox_messages")"
sink_ok=$(grep -c '"result":"accepted"' "$work/webhook-sink.log" || true)
j_runs=$(wc -l <"$work/janitor.summaries" 2>/dev/null || echo 0)
j_failed=$(awk '$2 != 0 || $0 !~ /"stopped_by":"done"/' "$work/janitor.summaries" 2>/dev/null | wc -l)
j_rows=$(sed -n -E 's/.*"rows_deleted":([0-9]+).*/\1/p' "$work/janitor.summaries" | awk '{ s += $1 } END { printf "%d", s }')

echo
echo "soak ($(date -u +%Y-%m-%dT%H:%MZ); ${duration}s; ${rate} env/s single route, $producers producers, payload ${payload} B;" \
	"an enqueue every ${outbox_every}s; PAYLOAD_RETENTION $retention, janitor every ${janitor_every}s;" \
	"server autovacuum $autovacuum, VACUUM after each janitor run $vacuum;" \
	"load average at start $load_start, at end $(loadavg))"
column -t -s $'\t' "$samples" 2>/dev/null || cat "$samples"
echo
echo "envelopes accepted: $accepted_total (sent but not accepted: $not_accepted; not sent, behind the rate: $unsent); enqueues 201: $enqueued (other answers: $bad_codes);" \
	"messages delivered $delivered, dead $dead, still pending $left; sink accepted $sink_ok deliveries"
echo "janitor: $j_runs runs, $j_failed failed, $j_rows payload rows deleted"
if [ -s "$work/vacuum.runs" ]; then
	awk '{ n++; s += $1; if ($1 > m) m = $1; if ($2 != 0) f++ } END {
		printf "VACUUM ANALYZE (server autovacuum off): %d runs, %d failed, %.1f s mean, %.1f s longest\n", n, f, s / n, m }' "$work/vacuum.runs"
fi
[ "$not_accepted" = 0 ] || status=1
[ "$bad_codes" = 0 ] && [ "$enqueued" -gt 0 ] || status=1
[ "$dead" = 0 ] && [ "$left" = 0 ] && [ "$delivered" = "$enqueued" ] || status=1
[ "$j_failed" = 0 ] && [ "$j_runs" -gt 0 ] && [ "$j_rows" -gt 0 ] || status=1

# The verdict: per figure, median of the last quarter of post-warm-up samples against the first quarter.
verdict=0
awk -F'\t' -v warm="$warmup" \
	-v trr="$tol_rss_rel" -v tra="$tol_rss_mib" -v thr="$tol_heap_rel" -v tha="$tol_heap_mib" \
	-v tgr="$tol_gor_rel" -v tga="$tol_gor_abs" -v tfr="$tol_fd_rel" -v tfa="$tol_fd_abs" -v tca="$tol_conn_abs" \
	-v t5r="$tol_p50_rel" -v t5a="$tol_p50_ms" -v t9r="$tol_p99_rel" -v t9a="$tol_p99_ms" '
function median(c, lo, hi,   m, i, k, t, b) {
	m = 0; for (i = lo; i <= hi; i++) b[++m] = v[c, i]
	for (i = 2; i <= m; i++) { t = b[i]; for (k = i - 1; k >= 1 && b[k] > t; k--) b[k + 1] = b[k]; b[k + 1] = t }
	return m % 2 ? b[(m + 1) / 2] : (b[m / 2] + b[m / 2 + 1]) / 2
}
# check COLUMN LABEL REL ABS: prints one row; sets bad when the last quarter grew past the allowance.
function check(k, label, rel, abs,   f, l, allow, ok) {
	f = median(k, 1, q); l = median(k, n - q + 1, n)
	allow = f * rel; if (abs > allow) allow = abs
	ok = (l <= f + allow)
	if (!ok) bad++
	printf "%-28s %10.2f %10.2f %+9.2f %10.2f   %s\n", label, f, l, l - f, allow, ok ? "flat" : "GREW"
}
NR == 1 { for (c = 1; c <= NF; c++) col[$c] = c; next }
$1 >= warm { n++; for (c = 1; c <= NF; c++) v[c, n] = $c }
END {
	if (n < 4) { print "verdict: too few samples after the warm-up"; exit 1 }
	q = int(n / 4)
	printf "\n%d samples after a %ds warm-up; quarters of %d samples\n", n, warm, q
	printf "%-28s %10s %10s %9s %10s   %s\n", "figure", "first q.", "last q.", "change", "allowed", "verdict"
	check(col["i_rss_mib"], "ingest-api RSS MiB", trr, tra)
	check(col["i_heap_mib"], "ingest-api heap in use MiB", thr, tha)
	check(col["i_gor"], "ingest-api goroutines", tgr, tga)
	check(col["i_fds"], "ingest-api open fds", tfr, tfa)
	check(col["c_ingest"], "ingest-api DB connections", 0, tca)
	check(col["w_rss_mib"], "delivery-worker RSS MiB", trr, tra)
	check(col["w_heap_mib"], "delivery-worker heap MiB", thr, tha)
	check(col["w_gor"], "delivery-worker goroutines", tgr, tga)
	check(col["w_fds"], "delivery-worker open fds", tfr, tfa)
	check(col["c_worker"], "delivery-worker DB conns", 0, tca)
	check(col["sink_rss_mib"], "webhook-sink RSS MiB", trr, tra)
	check(col["payload_rows"], "payload rows held", 0.25, 1000)
	check(col["p50_ms"], "ingest p50 ms", t5r, t5a)
	check(col["p99_ms"], "ingest p99 ms", t9r, t9a)
	# Not judged: the load average of the machine (2 vCPUs shared with whatever else runs) explains most of
	# the latency seen on a shared machine; printed so a latency verdict can be read against it.
	printf "%-28s %10.2f %10.2f   (machine load average, not judged)\n", "load average (1 min)", median(col["load1"], 1, q), median(col["load1"], n - q + 1, n)
	exit (bad > 0)
}' "$samples" || verdict=1
if [ "$verdict" = 0 ] && [ "$status" = 0 ]; then
	echo "verdict: FLAT — every figure within its allowance, every envelope accepted, every message delivered"
	exit 0
fi
echo "verdict: NOT FLAT (figures: $([ "$verdict" = 0 ] && echo ok || echo grew); run: $([ "$status" = 0 ] && echo ok || echo failures above))"
exit 1
