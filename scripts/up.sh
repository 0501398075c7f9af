#!/usr/bin/env bash
# up.sh — bring up a working local stack and show it working (`make up`; `make down` stops it).
#
#   1. PostgreSQL: DATABASE_URL when set (an admin URL: a database is created on that server), else
#      scripts/pg.sh (the server on 127.0.0.1:5432, or a throwaway cluster it starts).
#   2. A fresh database, envelopeworker_demo (DEMO_DATABASE), migrated by `envctl migrate`.
#   3. A demo tenant: device, service and operator credentials and a registered Ed25519 key; tokens and seeds are kept
#      in .tmp/stack/ (mode 0700), never printed.
#   4. ingest-api in the background on the first free port from 8080 (INGEST_PORT), metrics from 9090
#      (METRICS_PORT), as the least-privilege role envelopeworker_ingest when the server lets it in;
#      log in .tmp/stack/ingest-api.log; up.sh waits (bounded) for /readyz.
#   5. The outbox half: an outbound Ed25519 key for the demo tenant (OUTBOUND_SIGNING_KEYS_FILE, seed in
#      .tmp/stack/), a service credential, a generated whsec_ webhook secret (WEBHOOK_SECRETS_FILE), a
#      local webhook-sink (tools/webhook-sink) on the first free port from 8190 (SINK_PORT) that checks
#      the Standard Webhooks signature and the envelope signature and logs what it receives to
#      .tmp/stack/webhook-sink.log, and services/delivery-worker with DELIVERY_ALLOW_INSECURE_LOOPBACK=true
#      (the sink is plain http on 127.0.0.1), metrics/health from 9190 (WORKER_METRICS_PORT), as
#      envelopeworker_delivery when the server lets it in.
#   6. scripts/demo.sh: envelopes in order, a duplicate, a gap and its fill, refusals, a batch, and the
#      stream state; then an outbox message delivered to the sink, and a dead letter listed and replayed
#      by the operator credential; checking every answer.
#   7. A ready draft, .tmp/stack/example.json, and the exact commands to send it and to operate.
#
# up.sh records the database it created (.tmp/stack/demo-db) so down.sh can drop it again.
#
# Running it again stops the earlier processes and starts over with a fresh database. Works as root
# (pg.sh runs PostgreSQL itself as a non-root user) and as a normal user.
set -euo pipefail
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

need psql "install the PostgreSQL client (Debian: postgresql-client)"
need curl "install curl"
umask 077
mkdir -p "$stack"
chmod 700 "$stack"

# An earlier run's processes hold connections to the database about to be dropped.
stop_pidfile "$stack/delivery-worker.pid" delivery-worker
stop_pidfile "$stack/webhook-sink.pid" webhook-sink
stop_pidfile "$stack/ingest-api.pid" ingest-api

if [ -n "${DATABASE_URL:-}" ]; then
	admin=$DATABASE_URL
	check_url_dsn "$admin"
	answers "$admin" || die "DATABASE_URL ($(redact "$admin")) does not answer"
else
	pgenv=$("$root/scripts/pg.sh") || die "scripts/pg.sh could not provide a PostgreSQL"
	eval "$pgenv"
	admin=$TEST_DATABASE_URL
	# Remember that the cluster is ours so down.sh stops it; a second run reuses it (PG_STARTED_BY_US=0)
	# and must not forget.
	if [ "${PG_STARTED_BY_US:-0}" = 1 ]; then touch "$stack/pg-started"; fi
fi

db=${DEMO_DATABASE:-envelopeworker_demo}
log "fresh database $db on $(redact "$admin")"
fresh_db "$admin" "$db"
dsn=$(dsn_with_db "$admin" "$db")
# down.sh drops this database again when the server is not one pg.sh started for us (that one goes whole).
printf 'DEMO_ADMIN_URL=%q\nDEMO_DATABASE=%q\n' "$admin" "$db" >"$stack/demo-db"

build_stack_bins
envctl="$bindir/envctl"
"$envctl" migrate --database-url "$dsn" --timeout 2m >&2

ingest_dsn=$(dsn_with_user "$dsn" envelopeworker_ingest)
if answers "$ingest_dsn"; then
	log "ingest-api connects as envelopeworker_ingest (least privilege)"
else
	log "the server does not let envelopeworker_ingest in without a password; ingest-api uses the admin DSN"
	ingest_dsn=$dsn
fi

delivery_dsn=$(dsn_with_user "$dsn" envelopeworker_delivery)
if ! answers "$delivery_dsn"; then
	delivery_dsn=$dsn
fi

tenant=demo device=device-1 key_id=demo-key-1 service=svc-1 out_key_id=demo-out-1 secret_ref=demo-hooks
operator=ops-1 stale_ref=demo-stale
rm -rf "$stack/device.token" "$stack/device.seed" "$stack/stranger.seed" "$stack"/demo-proj-* \
	"$stack/service.token" "$stack/operator.token" "$stack/outbound.seed" "$stack/outbound-keys.json" \
	"$stack/webhook.secret" "$stack/webhook-secrets.json" "$stack/example.json" "$stack/last-demo-project"
"$envctl" credential issue --database-url "$dsn" --tenant "$tenant" --account acct-1 --device "$device" \
	--role device >"$stack/device.token" || die "credential issue failed"
pub=$("$envctl" keygen --seed-file "$stack/device.seed")
"$envctl" key add --database-url "$dsn" --tenant "$tenant" --key-id "$key_id" --public-key "$pub" >&2
# A second seed whose key is never registered: the demo signs with it under demo-key-1, which is what a
# tampered envelope looks like to the service.
"$envctl" keygen --seed-file "$stack/stranger.seed" >/dev/null

# The outbox: a service credential, the tenant's outbound signing key (only ingest-api's keys file holds
# the seed; receivers get the public key), and the webhook secret shared by the worker and the sink.
"$envctl" credential issue --database-url "$dsn" --tenant "$tenant" --account acct-1 --device "$service" \
	--role service >"$stack/service.token" || die "credential issue (service) failed"
# The operator reads dead letters and replays them (GET /v1/dead-letters, POST .../replay).
"$envctl" credential issue --database-url "$dsn" --tenant "$tenant" --account acct-1 --device "$operator" \
	--role operator >"$stack/operator.token" || die "credential issue (operator) failed"
out_pub=$("$envctl" keygen --seed-file "$stack/outbound.seed")
printf '{"%s":{"key_id":"%s","seed":"%s"}}\n' "$tenant" "$out_key_id" "$(tr -d '\n' <"$stack/outbound.seed")" \
	>"$stack/outbound-keys.json"
secret="whsec_$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
printf '%s\n' "$secret" >"$stack/webhook.secret"
# demo-stale starts as a secret the sink does not know: the demo's dead letter. demo.sh rewrites it.
printf '{"%s":["%s"],"%s":["whsec_%s"]}\n' "$secret_ref" "$secret" "$stale_ref" \
	"$(head -c 32 /dev/urandom | base64 | tr -d '\n')" >"$stack/webhook-secrets.json"
unset secret

ingest_port=${INGEST_PORT:-$(free_port 8080)}
metrics_port=${METRICS_PORT:-$(free_port 9090)}
[ "$ingest_port" != "$metrics_port" ] || metrics_port=$(free_port $((metrics_port + 1)))
url="http://127.0.0.1:$ingest_port"
log "starting ingest-api on $url (metrics on 127.0.0.1:$metrics_port)"
(
	export DATABASE_URL="$ingest_dsn" INGEST_ADDR="127.0.0.1:$ingest_port" METRICS_ADDR="127.0.0.1:$metrics_port"
	export OUTBOUND_SIGNING_KEYS_FILE="$stack/outbound-keys.json"
	start_ingest "$stack/ingest-api.pid" "$stack/ingest-api.log"
)
wait_ready "$url" "$stack/ingest-api.pid" "$stack/ingest-api.log" "${READY_TIMEOUT:-60}"
log "ingest-api is ready (pid $(cat "$stack/ingest-api.pid"))"

sink_port=${SINK_PORT:-$(free_port 8190)}
sink_url="http://127.0.0.1:$sink_port/hooks"
log "starting webhook-sink on $sink_url"
start_bg webhook-sink "$stack/webhook-sink.pid" "$stack/webhook-sink.log" --addr "127.0.0.1:$sink_port" \
	--secret-file "$stack/webhook.secret" --envelope-public-key "$out_pub"
wait_http "$sink_url" webhook-sink "$stack/webhook-sink.pid" "$stack/webhook-sink.log" 30

worker_metrics_port=${WORKER_METRICS_PORT:-$(free_port 9190)}
case "$worker_metrics_port" in "$ingest_port" | "$metrics_port" | "$sink_port") die "WORKER_METRICS_PORT collides with another port" ;; esac
log "starting delivery-worker (metrics and health on 127.0.0.1:$worker_metrics_port)"
(
	export DATABASE_URL="$delivery_dsn" METRICS_ADDR="127.0.0.1:$worker_metrics_port"
	export WEBHOOK_SECRETS_FILE="$stack/webhook-secrets.json" DELIVERY_ALLOW_INSECURE_LOOPBACK=true
	export DELIVERY_POLL_INTERVAL=${DELIVERY_POLL_INTERVAL:-200ms} SECRETS_RELOAD_INTERVAL=500ms
	start_bg delivery-worker "$stack/delivery-worker.pid" "$stack/delivery-worker.log"
)
wait_http "http://127.0.0.1:$worker_metrics_port/readyz" delivery-worker "$stack/delivery-worker.pid" \
	"$stack/delivery-worker.log" "${READY_TIMEOUT:-60}" ok
log "delivery-worker is ready (pid $(cat "$stack/delivery-worker.pid"))"

cat >"$stack/env" <<ENV
# Written by scripts/up.sh; read by scripts/demo.sh.
DATABASE_URL=$(printf '%q' "$dsn")
INGEST_URL=$url
METRICS_URL=http://127.0.0.1:$metrics_port/metrics
DEMO_TENANT=$tenant
DEMO_DEVICE=$device
DEMO_KEY_ID=$key_id
DEMO_SERVICE=$service
DEMO_OUT_KEY_ID=$out_key_id
DEMO_SECRET_REF=$secret_ref
DEMO_STALE_REF=$stale_ref
DEMO_OPERATOR=$operator
SINK_URL=$sink_url
WORKER_METRICS_URL=http://127.0.0.1:$worker_metrics_port/metrics
ENV

demo_status=0
"$root/scripts/demo.sh" || demo_status=$?

# A ready draft for the first hand-made envelope: a project of its own, so it starts a fresh stream.
stamp=$(date -u +%Y%m%d%H%M%S)
project=$(cat "$stack/last-demo-project" 2>/dev/null || echo PROJECT)
cat >"$stack/example.json" <<JSON
{
  "tenant_id": "$tenant",
  "project_id": "my-first-project",
  "producer_id": "$device",
  "event_id": "evt-$stamp",
  "idempotency_key": "idem-$stamp",
  "key_id": "$key_id",
  "sequence": 1,
  "issued_at": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "metadata": {"kind": "task.status"},
  "payload": {"hello": "world"}
}
JSON

cat <<MSG

The stack is up and stays up:
  ingest-api  $url  (pid $(cat "$stack/ingest-api.pid"), log .tmp/stack/ingest-api.log)
  metrics     http://127.0.0.1:$metrics_port/metrics
  worker      delivery-worker (pid $(cat "$stack/delivery-worker.pid"), log .tmp/stack/delivery-worker.log),
              metrics http://127.0.0.1:$worker_metrics_port/metrics
  sink        webhook-sink $sink_url (pid $(cat "$stack/webhook-sink.pid"), what it received: .tmp/stack/webhook-sink.log)
  database    $(redact "$dsn")
  device      tenant $tenant, device $device, key $key_id (token .tmp/stack/device.token, seed .tmp/stack/device.seed)
  service     $service (token .tmp/stack/service.token), outbound key $out_key_id (.tmp/stack/outbound-keys.json)
  operator    $operator (token .tmp/stack/operator.token): dead letters and replays
  envctl      .tmp/bin/envctl (and ingest-api, delivery-worker, webhook-sink, loadgen-ingest beside it)

A ready draft, .tmp/stack/example.json (envctl send signs it with the device's seed):
$(sed 's/^/  /' "$stack/example.json")

Next, from this directory:
  .tmp/bin/envctl send --url $url --token-file .tmp/stack/device.token \\
    --seed-file .tmp/stack/device.seed --file .tmp/stack/example.json
  # sending it again answers "duplicate"; raise "sequence" and change "event_id" for the next one

  set -a; . .tmp/stack/env; set +a     # DATABASE_URL and the demo's names, for envctl's database commands
  .tmp/bin/envctl audit list --tenant $tenant --limit 5
  .tmp/bin/envctl dlq list --tenant $tenant --project $project     # the demo's project
  curl -sS -H "Authorization: Bearer \$(cat .tmp/stack/operator.token)" "$url/v1/dead-letters?project_id=$project"

Stop it:        make down   (scripts/down.sh; see the README for what it removes)
MSG
if [ "$demo_status" != 0 ]; then
	log "the demo saw answers it did not expect (above); the stack is left running for a look"
	exit "$demo_status"
fi
