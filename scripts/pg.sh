#!/usr/bin/env bash
# pg.sh — make sure a PostgreSQL answers, and say how to reach it.
#
#   eval "$(scripts/pg.sh)"        # exports TEST_DATABASE_URL (admin DSN) and PG_STARTED_BY_US
#   scripts/pg.sh stop             # stops a cluster this script started (no-op otherwise)
#
# Order of preference:
#   1. TEST_DATABASE_URL, if set and answering;
#   2. a server on 127.0.0.1:5432 that lets user postgres in (trust auth, as on CI and dev machines);
#   3. a throwaway cluster made with the machine's PostgreSQL binaries in a temporary directory, run as
#      a non-root user (postgres, else nobody) when this script runs as root, on the first free port
#      from 55432 (PG_THROWAWAY=1 skips step 2). Its location is remembered in .tmp/pg.env so `stop` (and later runs) find it.
#   PG_THROWAWAY=prefer (scripts/test.sh's default) skips step 2 when the server binaries are installed.
#   A test run creates and drops a database per test, and on PostgreSQL 15 every DROP DATABASE waits
#   for a checkpoint of the whole server: on a shared server with fsync on, one that other work keeps
#   dirty, that wait is most of the run; a cluster of its own with durability off checkpoints at once.
#
# Everything it prints on stdout is shell to eval; progress goes to stderr.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
state_dir="$root/.tmp"
state="$state_dir/pg.env"
log() { printf 'pg.sh: %s\n' "$*" >&2; }

bindir() {
	local d
	if command -v pg_config >/dev/null 2>&1; then
		d=$(pg_config --bindir 2>/dev/null || true)
		if [ -x "$d/initdb" ]; then echo "$d"; return; fi
	fi
	# Debian keeps server binaries out of PATH, one folder per major version; take the newest.
	for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [ -x "$d/initdb" ]; then echo "$d"; return; fi
	done
	if command -v initdb >/dev/null 2>&1; then dirname "$(command -v initdb)"; return; fi
	log "no PostgreSQL server binaries found (install Debian's postgresql package)"
	exit 1
}

answers() { # answers DSN -> 0 when a query succeeds
	psql "$1" -XtAc 'select 1' >/dev/null 2>&1
}

as_owner() { # run a command as the cluster owner
	if [ "$(id -u)" = 0 ]; then
		runuser -u "$owner" -- "$@"
	else
		"$@"
	fi
}

pick_owner() {
	if [ "$(id -u)" != 0 ]; then owner=$(id -un); return; fi
	if id postgres >/dev/null 2>&1; then owner=postgres; else owner=nobody; fi
}

stop_ours() {
	[ -f "$state" ] || return 0
	# shellcheck disable=SC1090
	. "$state"
	if [ -n "${PG_THROWAWAY_DIR:-}" ] && [ -d "$PG_THROWAWAY_DIR/data" ]; then
		pick_owner
		as_owner "$(bindir)/pg_ctl" -D "$PG_THROWAWAY_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
		rm -rf "$PG_THROWAWAY_DIR"
		log "stopped the throwaway cluster"
	fi
	rm -f "$state"
}

if [ "${1:-}" = "stop" ]; then
	stop_ours
	exit 0
fi

if ! command -v psql >/dev/null 2>&1; then
	log "psql not found (install Debian's postgresql-client package)"
	exit 1
fi

if [ -n "${TEST_DATABASE_URL:-}" ] && answers "$TEST_DATABASE_URL"; then
	printf 'export TEST_DATABASE_URL=%q\nexport PG_STARTED_BY_US=0\n' "$TEST_DATABASE_URL"
	exit 0
fi

default_dsn="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
skip_default=0
case "${PG_THROWAWAY:-0}" in
1) skip_default=1 ;;
prefer) if (bindir) >/dev/null 2>&1; then skip_default=1; fi ;;
esac
if [ "$skip_default" = 0 ] && answers "$default_dsn"; then
	printf 'export TEST_DATABASE_URL=%q\nexport PG_STARTED_BY_US=0\n' "$default_dsn"
	exit 0
fi

# A cluster we started earlier and left running (make up, then make test)?
if [ -f "$state" ]; then
	# shellcheck disable=SC1090
	. "$state"
	if [ -n "${PG_THROWAWAY_DSN:-}" ] && answers "$PG_THROWAWAY_DSN"; then
		printf 'export TEST_DATABASE_URL=%q\nexport PG_STARTED_BY_US=0\n' "$PG_THROWAWAY_DSN"
		exit 0
	fi
	stop_ours
fi

bin=$(bindir)
pick_owner
port=55432
while (echo >"/dev/tcp/127.0.0.1/$port") >/dev/null 2>&1; do port=$((port + 1)); done
dir=$(mktemp -d "${TMPDIR:-/tmp}/envelopeworker-pg.XXXXXX")
chmod 755 "$dir"
[ "$(id -u)" = 0 ] && chown "$owner" "$dir"
log "starting a throwaway PostgreSQL on 127.0.0.1:$port as $owner"
as_owner "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --encoding=UTF8 --no-sync >"$dir/initdb.log" 2>&1 ||
	{ cat "$dir/initdb.log" >&2; exit 1; }
# Settings for a disposable test server: durability off, enough connections for concurrency tests.
cat >>"$dir/data/postgresql.conf" <<EOF
listen_addresses = '127.0.0.1'
port = $port
unix_socket_directories = '$dir'
max_connections = 300
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 start >/dev/null ||
	{ cat "$dir/server.log" >&2; exit 1; }
dsn="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
mkdir -p "$state_dir"
printf 'PG_THROWAWAY_DIR=%q\nPG_THROWAWAY_DSN=%q\n' "$dir" "$dsn" >"$state"
printf 'export TEST_DATABASE_URL=%q\nexport PG_STARTED_BY_US=1\n' "$dsn"
