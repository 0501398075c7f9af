#!/usr/bin/env bash
# down.sh — undo what scripts/up.sh did (`make down`). Safe to run twice.
#
#   - delivery-worker, webhook-sink and ingest-api: stopped by their pid files under .tmp/stack.
#   - PostgreSQL: a throwaway cluster that scripts/pg.sh started for up.sh is stopped and deleted, and the
#     demo database with it. On a server that was already running (127.0.0.1:5432, or DATABASE_URL's),
#     the demo database up.sh created (envelopeworker_demo, or DEMO_DATABASE) is dropped; the roles the
#     migrations made (envelopeworker_ingest, _delivery, _janitor, _operator) are left, because they are
#     cluster-wide and every database migrated on that server shares them (the test databases, a real
#     deployment); down.sh names them so nobody wonders.
#   - .tmp/bin (the built binaries) and .tmp/stack's tokens, seeds and logs stay for a look; `rm -rf .tmp`
#     removes them.
set -euo pipefail
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

stop_pidfile "$stack/delivery-worker.pid" delivery-worker
stop_pidfile "$stack/webhook-sink.pid" webhook-sink
stop_pidfile "$stack/ingest-api.pid" ingest-api
if [ -f "$stack/pg-started" ]; then
	"$root/scripts/pg.sh" stop
	rm -f "$stack/pg-started" "$stack/demo-db"
	log "the throwaway PostgreSQL and its demo database are gone"
elif [ -f "$stack/demo-db" ]; then
	# shellcheck disable=SC1091
	. "$stack/demo-db"
	case "$DEMO_DATABASE" in *[!a-z0-9_]* | "") die "database name $DEMO_DATABASE in .tmp/stack/demo-db: refusing to drop it" ;; esac
	if PGOPTIONS="-c client_min_messages=warning" psql "$DEMO_ADMIN_URL" -XqAt -v ON_ERROR_STOP=1 \
		-c "DROP DATABASE IF EXISTS $DEMO_DATABASE WITH (FORCE)" >/dev/null; then
		rm -f "$stack/demo-db"
		log "dropped database $DEMO_DATABASE on $(redact "$DEMO_ADMIN_URL")"
		log "left on that server: the roles envelopeworker_ingest, envelopeworker_delivery, envelopeworker_janitor" \
			"and envelopeworker_operator (cluster-wide, shared by every database migrated there)"
	else
		log "could not drop database $DEMO_DATABASE on $(redact "$DEMO_ADMIN_URL") (is the server down?); it is left"
	fi
fi
rm -f "$stack/env"
log "stopped"
