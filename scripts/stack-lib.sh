# stack-lib.sh — shared by up.sh, demo.sh, down.sh, soak.sh and the bench-*.sh scripts (source it; not a command).
#
# Everything the local stack starts is recorded under .tmp/stack/ (pid files, logs, the demo's token and
# seed), so down.sh stops exactly what was started, by pid, and nothing else.

# The name every message of the sourcing script starts with.
script_name=$(basename "$0")

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp="$root/.tmp"
stack="$tmp/stack"
bindir="$tmp/bin"

# Bounded waits: libpq (psql, pgbench) gives up on a silent server instead of waiting for TCP's timeout.
export PGCONNECT_TIMEOUT=${PGCONNECT_TIMEOUT:-10}

log() { printf '%s: %s\n' "${script_name:-stack}" "$*" >&2; }
die() { log "$*"; exit 1; }

need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"; }

# free_port START -> the first port from START that nothing listens on (bounded search).
free_port() {
	local p=$1 end=$(($1 + 200))
	while [ "$p" -lt "$end" ]; do
		if ! (echo >"/dev/tcp/127.0.0.1/$p") >/dev/null 2>&1; then
			echo "$p"
			return 0
		fi
		p=$((p + 1))
	done
	die "no free port in $1-$end"
}

# URL-form DSNs only: the scripts edit the database name and the user.
check_url_dsn() {
	case "$1" in
	postgres://* | postgresql://*) ;;
	*) die "DATABASE_URL must be a postgres:// URL (key=value DSNs are not supported by these scripts)" ;;
	esac
}

# dsn_with_db DSN NAME -> DSN naming database NAME.
dsn_with_db() { printf '%s' "$1" | sed -E 's#^(postgres(ql)?://[^/?]*)(/[^?]*)?#\1/'"$2"'#'; }

# dsn_with_user DSN USER -> DSN connecting as USER without a password (trust or certificate auth).
dsn_with_user() { printf '%s' "$1" | sed -E 's#^(postgres(ql)?://)([^@/?]*@)?#\1'"$2"'@#'; }

# redact DSN -> DSN with any password masked, for messages.
redact() { printf '%s' "$1" | sed -E 's#^([a-z]+://[^:@/?]*):[^@/?]*@#\1:****@#'; }

answers() { psql "$1" -XtAc 'select 1' >/dev/null 2>&1; }

# fresh_db ADMIN_DSN NAME: drop (disconnecting its sessions) and create database NAME.
fresh_db() {
	local admin=$1 name=$2
	# Quiet the NOTICE that DROP ... IF EXISTS prints on a first run.
	local PGOPTIONS="-c client_min_messages=warning"
	export PGOPTIONS
	case "$name" in *[!a-z0-9_]* | "") die "database name $name: use lowercase letters, digits and _" ;; esac
	psql "$admin" -XqAt -v ON_ERROR_STOP=1 -c "DROP DATABASE IF EXISTS $name WITH (FORCE)" >/dev/null ||
		die "cannot drop database $name"
	psql "$admin" -XqAt -v ON_ERROR_STOP=1 -c "CREATE DATABASE $name" >/dev/null ||
		die "cannot create database $name"
}

# bench_init NAME: what a bench script that runs ingest-api needs before it starts anything: psql and
# curl, a fresh private work directory $work ($tmp/NAME, mode 700: it will hold tokens and seeds), and
# the state its cleanup reads ($pidfile of ingest-api, $started_pg, $admin) at "nothing started".
bench_init() {
	need psql "install the PostgreSQL client (Debian: postgresql-client)"
	need curl "install curl"
	work="$tmp/$1"
	rm -rf "$work"
	mkdir -p "$work"
	chmod 700 "$work"
	pidfile="$work/ingest-api.pid"
	started_pg=0
	admin=""
}

# use_pg: a PostgreSQL from scripts/pg.sh (the server on 127.0.0.1:5432, TEST_DATABASE_URL's, or a
# throwaway cluster). Sets admin to its admin DSN and started_pg to 1 when the cluster is ours to stop
# (release_pg does).
use_pg() {
	local pgenv
	pgenv=$("$root/scripts/pg.sh") || die "scripts/pg.sh could not provide a PostgreSQL"
	eval "$pgenv"
	started_pg=${PG_STARTED_BY_US:-0}
	check_url_dsn "$TEST_DATABASE_URL"
	admin=$TEST_DATABASE_URL
}

# use_fresh_db NAME: use_pg, then a fresh database NAME on it; sets dsn to its DSN.
use_fresh_db() {
	use_pg
	log "fresh database $1 on $(redact "$admin")"
	fresh_db "$admin" "$1"
	dsn=$(dsn_with_db "$admin" "$1")
}

# release_pg NAME KEEP: the other end of use_pg, for an EXIT trap: drops database NAME unless KEEP is
# 1 (quietly: it may never have been made), and stops the cluster if use_pg started it.
release_pg() {
	if [ -n "${admin:-}" ] && [ "$2" != 1 ]; then
		PGOPTIONS="-c client_min_messages=warning" psql "$admin" -XqAt -c "DROP DATABASE IF EXISTS $1 WITH (FORCE)" >/dev/null 2>&1 || true
	fi
	if [ "${started_pg:-0}" = 1 ]; then "$root/scripts/pg.sh" stop; fi
}

# ingest_pkg -> the package path of ingest-api's main, wherever the service keeps it.
ingest_pkg() {
	local d
	for d in services/ingest-api services/ingest-api/cmd/ingest-api; do
		if [ -f "$root/$d/main.go" ]; then echo "./$d"; return 0; fi
	done
	die "ingest-api has no main package yet (looked in services/ingest-api and services/ingest-api/cmd/ingest-api)"
}

# build_at_rev REV PKG OUT: build PKG as it was at git revision REV into OUT, from the revision's tree
# exported with git archive (the working tree stays untouched): the same-run baseline of a benchmark.
build_at_rev() {
	local rev=$1 pkg=$2 out=$3 dir
	need git "install git"
	dir=$(mktemp -d)
	if ! git -C "$root" archive "$rev" | tar -x -C "$dir"; then
		rm -rf "$dir"
		die "cannot export $rev"
	fi
	log "building $pkg as of $rev"
	if ! (cd "$dir" && go build -o "$out" "$pkg"); then
		rm -rf "$dir"
		die "go build $pkg at $rev failed"
	fi
	rm -rf "$dir"
}

build_bins() {
	need go "install Go 1.26"
	mkdir -p "$bindir"
	log "building envctl, loadgen-ingest and ingest-api into .tmp/bin"
	(cd "$root" && go build -o "$bindir/envctl" ./tools/envctl) || die "go build envctl failed"
	(cd "$root" && go build -o "$bindir/loadgen-ingest" ./tools/loadgen-ingest) || die "go build loadgen-ingest failed"
	(cd "$root" && go build -o "$bindir/ingest-api" "$(ingest_pkg)") || die "go build ingest-api failed"
}

# build_stack_bins: build_bins plus what the outbox half of the stack runs: delivery-worker and the demo's
# webhook-sink.
build_stack_bins() {
	build_bins
	log "building delivery-worker and webhook-sink into .tmp/bin"
	(cd "$root" && go build -o "$bindir/delivery-worker" ./services/delivery-worker) || die "go build delivery-worker failed"
	(cd "$root" && go build -o "$bindir/webhook-sink" ./tools/webhook-sink) || die "go build webhook-sink failed"
}

# alive PIDFILE NAME -> 0 when the recorded pid runs the named binary (a recycled pid is not ours).
alive() {
	local pidfile=$1 name=$2 pid
	[ -f "$pidfile" ] || return 1
	pid=$(cat "$pidfile")
	case "$pid" in '' | *[!0-9]*) return 1 ;; esac
	kill -0 "$pid" 2>/dev/null || return 1
	[ -r "/proc/$pid/cmdline" ] || return 0 # no procfs: trust the pid file
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q -- "$name"
}

# started PIDFILE -> 0 while the process we just started runs. The start-up waits use this rather than
# alive: between fork and exec the child's command line is still the shell's, and a pid this fresh cannot
# have been recycled.
started() {
	local pid
	pid=$(cat "$1" 2>/dev/null) || return 1
	case "$pid" in '' | *[!0-9]*) return 1 ;; esac
	kill -0 "$pid" 2>/dev/null
}

# stop_pidfile PIDFILE NAME: SIGTERM, up to 30 s for a graceful exit, then SIGKILL.
stop_pidfile() {
	local pidfile=$1 name=$2 pid i
	if ! alive "$pidfile" "$name"; then
		rm -f "$pidfile"
		return 0
	fi
	pid=$(cat "$pidfile")
	log "stopping $name (pid $pid)"
	kill -TERM "$pid" 2>/dev/null || true
	for i in $(seq 1 60); do
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.5
	done
	if kill -0 "$pid" 2>/dev/null; then
		log "$name (pid $pid) did not stop in 30 s; killing it"
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$pidfile"
}

# start_ingest PIDFILE LOGFILE: starts .tmp/bin/ingest-api in the background with the caller's
# exported configuration (DATABASE_URL, INGEST_ADDR, ...), detached from the terminal.
start_ingest() {
	local pidfile=$1 logfile=$2
	if command -v setsid >/dev/null 2>&1; then
		setsid "$bindir/ingest-api" >"$logfile" 2>&1 </dev/null &
	else
		nohup "$bindir/ingest-api" >"$logfile" 2>&1 </dev/null &
	fi
	echo $! >"$pidfile"
}

# start_bg NAME PIDFILE LOGFILE [ARGS...]: starts .tmp/bin/NAME ARGS in the background with the caller's
# exported environment, detached from the terminal, recording its pid.
start_bg() {
	local name=$1 pidfile=$2 logfile=$3
	shift 3
	if command -v setsid >/dev/null 2>&1; then
		setsid "$bindir/$name" "$@" >"$logfile" 2>&1 </dev/null &
	else
		nohup "$bindir/$name" "$@" >"$logfile" 2>&1 </dev/null &
	fi
	echo $! >"$pidfile"
}

# wait_http URL NAME PIDFILE LOGFILE SECONDS [ok]: polls URL until it answers (any HTTP status, or only a
# 2xx with "ok"), the process dies, or time runs out.
wait_http() {
	local url=$1 name=$2 pidfile=$3 logfile=$4 secs=$5 fail=""
	local i
	[ "${6:-}" = ok ] && fail=-f
	for i in $(seq 1 $((secs * 4))); do
		if ! started "$pidfile"; then
			tail -n 20 "$logfile" >&2 || true
			die "$name exited during start-up (log: ${logfile#"$root"/})"
		fi
		if curl $fail -sS -o /dev/null --max-time 2 "$url" 2>/dev/null; then
			return 0
		fi
		sleep 0.25
	done
	tail -n 20 "$logfile" >&2 || true
	die "$name not answering after $secs s (log: ${logfile#"$root"/})"
}

# wait_ready URL PIDFILE LOGFILE SECONDS: polls URL/readyz until 200, the process dies, or time runs out.
wait_ready() {
	local url=$1 pidfile=$2 logfile=$3 secs=$4 i
	for i in $(seq 1 $((secs * 4))); do
		if ! started "$pidfile"; then
			tail -n 20 "$logfile" >&2 || true
			die "ingest-api exited during start-up (log: ${logfile#"$root"/})"
		fi
		if curl -fsS -o /dev/null --max-time 2 "$url/readyz" 2>/dev/null; then
			return 0
		fi
		sleep 0.25
	done
	tail -n 20 "$logfile" >&2 || true
	die "ingest-api not ready after $secs s (log: ${logfile#"$root"/})"
}
