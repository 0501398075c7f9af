#!/usr/bin/env bash
# up.sh — bring up a working local stack and show it working (`make up`; `make down` stops it).
#
#   1. PostgreSQL: DATABASE_URL when set (an admin URL: a database is created on that server), else
#      scripts/pg.sh (the server on 127.0.0.1:5432, or a throwaway cluster it starts).
#   2. A fresh database, envelopeworker_demo (DEMO_DATABASE), migrated by `envctl migrate`.
#   3. A demo tenant: a device credential and a registered Ed25519 key; the token and the seed are kept
#      in .tmp/stack/ (mode 0700), never printed.
#   4. ingest-api in the background on the first free port from 8080 (INGEST_PORT), metrics from 9090
#      (METRICS_PORT), as the least-privilege role envelopeworker_ingest when the server lets it in;
#      log in .tmp/stack/ingest-api.log; up.sh waits (bounded) for /readyz.
#   5. scripts/demo.sh: envelopes in order, a duplicate, a gap and its fill, refusals, a batch, and the
#      stream state, checking every answer.
#
# Running it again stops the earlier ingest-api and starts over with a fresh database. Works as root
# (pg.sh runs PostgreSQL itself as a non-root user) and as a normal user.
set -euo pipefail
script_name=up.sh
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

need psql "install the PostgreSQL client (Debian: postgresql-client)"
need curl "install curl"
umask 077
mkdir -p "$stack"
chmod 700 "$stack"

# An earlier run's ingest-api holds connections to the database about to be dropped.
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

build_bins
envctl="$bindir/envctl"
"$envctl" migrate --database-url "$dsn" --timeout 2m >&2

ingest_dsn=$(dsn_with_user "$dsn" envelopeworker_ingest)
if answers "$ingest_dsn"; then
	log "ingest-api connects as envelopeworker_ingest (least privilege)"
else
	log "the server does not let envelopeworker_ingest in without a password; ingest-api uses the admin DSN"
	ingest_dsn=$dsn
fi

tenant=demo device=device-1 key_id=demo-key-1
rm -rf "$stack/device.token" "$stack/device.seed" "$stack/stranger.seed" "$stack"/demo-*
"$envctl" credential issue --database-url "$dsn" --tenant "$tenant" --account acct-1 --device "$device" \
	--role device >"$stack/device.token" || die "credential issue failed"
pub=$("$envctl" keygen --seed-file "$stack/device.seed")
"$envctl" key add --database-url "$dsn" --tenant "$tenant" --key-id "$key_id" --public-key "$pub" >&2
# A second seed whose key is never registered: the demo signs with it under demo-key-1, which is what a
# tampered envelope looks like to the service.
"$envctl" keygen --seed-file "$stack/stranger.seed" >/dev/null

ingest_port=${INGEST_PORT:-$(free_port 8080)}
metrics_port=${METRICS_PORT:-$(free_port 9090)}
[ "$ingest_port" != "$metrics_port" ] || metrics_port=$(free_port $((metrics_port + 1)))
url="http://127.0.0.1:$ingest_port"
log "starting ingest-api on $url (metrics on 127.0.0.1:$metrics_port)"
(
	export DATABASE_URL="$ingest_dsn" INGEST_ADDR="127.0.0.1:$ingest_port" METRICS_ADDR="127.0.0.1:$metrics_port"
	start_ingest "$stack/ingest-api.pid" "$stack/ingest-api.log"
)
wait_ready "$url" "$stack/ingest-api.pid" "$stack/ingest-api.log" "${READY_TIMEOUT:-60}"
log "ingest-api is ready (pid $(cat "$stack/ingest-api.pid"))"

cat >"$stack/env" <<ENV
# Written by scripts/up.sh; read by scripts/demo.sh.
DATABASE_URL=$(printf '%q' "$dsn")
INGEST_URL=$url
METRICS_URL=http://127.0.0.1:$metrics_port/metrics
DEMO_TENANT=$tenant
DEMO_DEVICE=$device
DEMO_KEY_ID=$key_id
ENV

demo_status=0
"$root/scripts/demo.sh" || demo_status=$?

cat <<MSG

The stack is up and stays up:
  ingest-api  $url  (pid $(cat "$stack/ingest-api.pid"), log .tmp/stack/ingest-api.log)
  metrics     http://127.0.0.1:$metrics_port/metrics
  database    $(redact "$dsn")
  device      tenant $tenant, device $device, key $key_id (token .tmp/stack/device.token, seed .tmp/stack/device.seed)
Send your own:  .tmp/bin/envctl send --url $url --token-file .tmp/stack/device.token \\
                  --seed-file .tmp/stack/device.seed --file DRAFT.json
Operate:        DATABASE_URL='$(redact "$dsn")' .tmp/bin/envctl audit list --tenant $tenant
Stop it:        make down   (scripts/down.sh)
MSG
if [ "$demo_status" != 0 ]; then
	log "the demo saw answers it did not expect (above); the stack is left running for a look"
	exit "$demo_status"
fi
