#!/usr/bin/env bash
# down.sh — stop what scripts/up.sh started (`make down`): delivery-worker, webhook-sink and ingest-api by
# their pid files under .tmp/stack, and the throwaway PostgreSQL cluster if up.sh had scripts/pg.sh start
# one. A server that was already
# running (or DATABASE_URL's) is left alone, and so is the demo database on it. Safe to run twice.
set -euo pipefail
script_name=down.sh
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

stop_pidfile "$stack/delivery-worker.pid" delivery-worker
stop_pidfile "$stack/webhook-sink.pid" webhook-sink
stop_pidfile "$stack/ingest-api.pid" ingest-api
if [ -f "$stack/pg-started" ]; then
	"$root/scripts/pg.sh" stop
	rm -f "$stack/pg-started"
fi
rm -f "$stack/env"
log "stopped"
