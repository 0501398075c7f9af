#!/usr/bin/env bash
# demo.sh — a short, checked demonstration against the stack scripts/up.sh started (run by up.sh; can be
# run again on its own: every run uses a new project, so its streams start empty).
#
# It sends, with `envctl send` as the device: envelopes 1 and 2 in order, 2 again (duplicate), 4 (a gap:
# accepted, the cursor stays), 3 (fills the gap: the cursor jumps to 4), event 1 again with other content
# (event_conflict), a producer_id that is not the device (route_mismatch), an envelope signed by a key
# other than the registered one (bad_signature), an Idempotency-Key header that disagrees with the
# envelope (idempotency_key_mismatch), a batch of 5 and 6; then reads the stream state over HTTP and the
# audit rows with envctl. Then the outbox: it registers an endpoint pointing at the local webhook-sink,
# POSTs /v1/outbox as the service (201), repeats it (200, byte-identical), shows idempotency_conflict and
# no_endpoint, polls GET /v1/outbox/{id} until the worker has delivered it (bounded), and prints what the
# sink received (signature checked, envelope verified with the outbound public key). Then a dead letter:
# an endpoint under the secret ref DEMO_STALE_REF, which holds a secret the sink does not know, so the
# sink answers 401 and the message is dead at once (http_4xx); the operator lists it (GET
# /v1/dead-letters, and envctl dlq list), the demo puts the sink's secret under that ref (the worker
# reloads its secrets file on change), the operator replays it (POST /v1/dead-letters/{id}/replay), it
# is delivered, and the replay's audit row is shown. Every answer is printed and checked; a surprise
# makes the exit status 1.
set -euo pipefail
umask 077
# shellcheck source=scripts/stack-lib.sh
. "$(dirname "$0")/stack-lib.sh"

[ -f "$stack/env" ] || die "no stack (.tmp/stack/env missing): run scripts/up.sh first"
# shellcheck disable=SC1091
. "$stack/env"
envctl="$bindir/envctl"
[ -x "$envctl" ] || die ".tmp/bin/envctl missing: run scripts/up.sh first"
need curl "install curl"

project="proj-$(date -u +%H%M%S)"
issued=$(date -u +%Y-%m-%dT%H:%M:%SZ) # fixed for the run: a duplicate must be byte-identical content
drafts="$stack/demo-$project"
printf '%s\n' "$project" >"$stack/last-demo-project" # for the commands up.sh prints
mkdir -p "$drafts"
surprises=0

# draft FILE SEQ EVENT_ID [PRODUCER] [PAYLOAD_NOTE]: an unsigned envelope for envctl send.
draft() {
	cat >"$1" <<JSON
{
  "tenant_id": "$DEMO_TENANT",
  "project_id": "$project",
  "producer_id": "${4:-$DEMO_DEVICE}",
  "event_id": "$3",
  "idempotency_key": "idem-$3",
  "key_id": "$DEMO_KEY_ID",
  "sequence": $2,
  "issued_at": "$issued",
  "metadata": {"kind": "task.status"},
  "payload": {"step": $2, "note": "${5:-demo}"}
}
JSON
}

# send WANT_STATUS WANT_TEXT TITLE DRAFT [envctl send flags...]: sends, prints, checks the answer.
send() {
	local want=$1 text=$2 title=$3 file=$4 out status
	shift 4
	printf '\n== %s\n' "$title"
	out=$("$envctl" send --url "$INGEST_URL" --token-file "$stack/device.token" \
		--seed-file "${SEED:-$stack/device.seed}" --file "$file" "$@" 2>&1) || true
	printf '%s\n' "$out" | sed 's/^/   /'
	status=$(printf '%s\n' "$out" | sed -n '1s/^HTTP \([0-9][0-9]*\)$/\1/p')
	if [ "$status" != "$want" ] || ! printf '%s' "$out" | grep -q -- "$text"; then
		printf '   !! expected HTTP %s with %s\n' "$want" "$text"
		surprises=$((surprises + 1))
	fi
}

echo "Demo: tenant $DEMO_TENANT, project $project, device $DEMO_DEVICE, key $DEMO_KEY_ID, issued_at $issued"

draft "$drafts/1.json" 1 evt-1
draft "$drafts/2.json" 2 evt-2
draft "$drafts/3.json" 3 evt-3
draft "$drafts/4.json" 4 evt-4
send 200 '"cursor":1' "sequence 1: accepted, cursor 1" "$drafts/1.json"
send 200 '"cursor":2' "sequence 2: accepted, cursor 2" "$drafts/2.json"
send 200 '"outcome":"duplicate"' "sequence 2 again: duplicate (same content), nothing stored twice" "$drafts/2.json"
send 200 '"cursor":2' "sequence 4: accepted ahead of a gap at 3; the cursor stays at 2" "$drafts/4.json"
send 200 '"cursor":4' "sequence 3 fills the gap: the cursor advances through 3 and 4" "$drafts/3.json"

draft "$drafts/conflict.json" 5 evt-1 "" changed
send 409 '"reason":"event_conflict"' "event evt-1 again with other content: event_conflict" "$drafts/conflict.json"

draft "$drafts/route.json" 5 evt-route device-2
send 403 '"reason":"route_mismatch"' "producer_id device-2 sent with device-1's credential: route_mismatch" "$drafts/route.json"

draft "$drafts/tampered.json" 5 evt-tampered
SEED="$stack/stranger.seed" send 403 '"reason":"bad_signature"' \
	"signed by another key under key_id $DEMO_KEY_ID (as if tampered): bad_signature" "$drafts/tampered.json"

draft "$drafts/header.json" 5 evt-header
send 400 '"reason":"idempotency_key_mismatch"' "Idempotency-Key header disagrees with the envelope: idempotency_key_mismatch" \
	"$drafts/header.json" --idempotency-header other-key

draft "$drafts/5.json" 5 evt-5
draft "$drafts/6.json" 6 evt-6
{ printf '{"envelopes":['; cat "$drafts/5.json"; printf ','; cat "$drafts/6.json"; printf ']}\n'; } >"$drafts/batch.json"
send 200 '"cursor":6' "a batch of sequences 5 and 6: one answer per envelope" "$drafts/batch.json" --batch

printf '\n== the stream state, as the device reads it (GET /v1/streams/%s/%s)\n' "$project" "$DEMO_DEVICE"
printf 'Authorization: Bearer %s\n' "$(cat "$stack/device.token")" >"$drafts/auth.header"
state=$(curl -sS --max-time 10 -H "@$drafts/auth.header" "$INGEST_URL/v1/streams/$project/$DEMO_DEVICE" || true)
rm -f "$drafts/auth.header"
printf '   %s\n' "$state"
case "$state" in
*'"cursor":6'*'"replay_floor":0'* | *'"replay_floor":0'*'"cursor":6'*) ;;
*) printf '   !! expected cursor 6 and replay floor 0\n'; surprises=$((surprises + 1)) ;;
esac

printf '\n== the last audit rows (envctl audit list --tenant %s --project %s --limit 4)\n' "$DEMO_TENANT" "$project"
"$envctl" audit list --database-url "$DATABASE_URL" --tenant "$DEMO_TENANT" --project "$project" --limit 4 |
	sed 's/^/   /' || surprises=$((surprises + 1))

# --- the outbox ---------------------------------------------------------------------------------------

# set_stale_secret SECRET: makes SECRET the worker's only secret for DEMO_STALE_REF and waits (at most
# 15 s) until the worker has reloaded its secrets file. The rename makes the change atomic for the
# worker, which reloads the file when its content changes.
set_stale_secret() {
	local file="$stack/webhook-secrets.json" before now
	before=$(reloads)
	sed -E 's#("'"$DEMO_STALE_REF"'":\[)"[^"]*"#\1"'"$1"'"#' "$file" >"$file.new" && mv "$file.new" "$file"
	for _ in $(seq 1 30); do
		now=$(reloads)
		[ "$now" -gt "$before" ] && return 0
		sleep 0.5
	done
	printf '   !! the delivery-worker did not reload its secrets file within 15 s\n'
	surprises=$((surprises + 1))
}
reloads() { # the worker's count of successful secrets reloads
	curl -sS --max-time 5 "$WORKER_METRICS_URL" 2>/dev/null |
		awk '/^envelopeworker_delivery_secret_reloads_total\{result="ok"\}/ { n = $2 } END { printf "%d\n", n + 0 }'
}

# dead_letter_and_replay: a message to an endpoint whose secret the receiver does not know is refused
# (401, dead at once with http_4xx); the operator lists it, the secret is corrected, the operator
# replays it, and it is delivered.
dead_letter_and_replay() {
	local topic=task.audits endpoint request dead
	printf '\n== a dead letter: %s/%s -> the sink, signed with secret ref %s, which the sink does not know\n' \
		"$project" "$topic" "$DEMO_STALE_REF"
	set_stale_secret "whsec_$(head -c 32 /dev/urandom | base64 | tr -d '\n')"
	endpoint=$("$envctl" endpoint add --database-url "$DATABASE_URL" --tenant "$DEMO_TENANT" --project "$project" \
		--topic "$topic" --url "$SINK_URL" --secret-ref "$DEMO_STALE_REF") || {
		printf '   !! endpoint add failed\n'
		surprises=$((surprises + 1))
	}
	printf '   %s\n' "$endpoint"
	request='{"project_id":"'"$project"'","topic":"'"$topic"'","idempotency_key":"audit-1","kind":"audit","payload":{"what":"nightly audit"},"max_attempts":5}'
	api POST /v1/outbox "$request"
	check 201 '"message_ids":\["msg_'
	dead=$(printf '%s' "$answer" | sed -n 's/.*"message_ids":\["\([^"]*\)".*/\1/p')
	printf '\n== GET /v1/outbox/%s: the sink answers 401 (bad_signature), so the message is dead at once\n' "${dead:-?}"
	await "$dead" dead delivered
	check 200 '"status":"dead"'

	printf '\n== GET /v1/dead-letters?project_id=%s as the operator %s\n' "$project" "${DEMO_OPERATOR:-}"
	AS=operator api GET "/v1/dead-letters?project_id=$project"
	check 200 '"error_code":"http_4xx"'
	printf '\n== envctl dlq list --tenant %s --project %s (the same, from the database)\n' "$DEMO_TENANT" "$project"
	"$envctl" dlq list --database-url "$DATABASE_URL" --tenant "$DEMO_TENANT" --project "$project" |
		sed 's/^/   /' || surprises=$((surprises + 1))

	printf '\n== the receiver'"'"'s secret goes into the worker'"'"'s secrets file under %s (reloaded on change)\n' "$DEMO_STALE_REF"
	set_stale_secret "$(tr -d '\n' <"$stack/webhook.secret")"
	printf '\n== POST /v1/dead-letters/%s/replay as the operator: back to pending, same id and body\n' "${dead:-?}"
	AS=operator api POST "/v1/dead-letters/$dead/replay"
	check 200 '"message_id":"'"$dead"'"'
	printf '\n== GET /v1/outbox/%s until the replay is delivered (at most 30 s)\n' "${dead:-?}"
	await "$dead" delivered
	check 200 '"status":"delivered"'
	printf '\n== the replay'"'"'s audit row (envctl audit list --tenant %s --project %s --limit 1)\n' "$DEMO_TENANT" "$project"
	local audit
	audit=$("$envctl" audit list --database-url "$DATABASE_URL" --tenant "$DEMO_TENANT" --project "$project" --limit 1) ||
		surprises=$((surprises + 1))
	printf '   %s\n' "$audit"
	case "$audit" in *'"replayed"'*) ;; *) printf '   !! expected an audit row with outcome replayed\n'; surprises=$((surprises + 1)) ;; esac
}

if [ -n "${SINK_URL:-}" ] && [ -f "$stack/service.token" ]; then
	printf 'Authorization: Bearer %s\n' "$(cat "$stack/service.token")" >"$drafts/service.header"
	if [ -f "$stack/operator.token" ]; then
		printf 'Authorization: Bearer %s\n' "$(cat "$stack/operator.token")" >"$drafts/operator.header"
	fi

	# api METHOD PATH [BODY]: as the service (AS=operator: as the operator); sets $code and $answer.
	api() {
		local out body=()
		[ $# -lt 3 ] || body=(--data-binary "$3")
		out=$(curl -sS --max-time 10 -H "@$drafts/${AS:-service}.header" -H 'Content-Type: application/json' \
			-X "$1" "${body[@]}" -w '\n%{http_code}' "$INGEST_URL$2" 2>&1) || true
		code=${out##*$'\n'}
		answer=${out%$'\n'*}
	}
	# await MESSAGE STATUS...: polls GET /v1/outbox/MESSAGE (at most 30 s) until its status is one of STATUS.
	await() {
		local id=$1 st
		shift
		for _ in $(seq 1 60); do
			[ -n "$id" ] || return 0
			api GET "/v1/outbox/$id"
			st=$(printf '%s' "$answer" | sed -n 's/.*"status":"\([a-z]*\)".*/\1/p')
			case " $* " in *" $st "*) return 0 ;; esac
			sleep 0.5
		done
	}
	# check WANT_CODE WANT_TEXT TITLE: prints and checks the last answer.
	check() {
		printf '   HTTP %s\n   %s\n' "$code" "$answer"
		if [ "$code" != "$1" ] || ! printf '%s' "$answer" | grep -q -- "$2"; then
			printf '   !! expected HTTP %s with %s\n' "$1" "$2"
			surprises=$((surprises + 1))
		fi
	}

	topic=task.proposals
	printf '\n== envctl endpoint add: %s/%s -> %s (secret ref %s)\n' "$project" "$topic" "$SINK_URL" "$DEMO_SECRET_REF"
	endpoint=$("$envctl" endpoint add --database-url "$DATABASE_URL" --tenant "$DEMO_TENANT" --project "$project" \
		--topic "$topic" --url "$SINK_URL" --secret-ref "$DEMO_SECRET_REF") || {
		printf '   !! endpoint add failed\n'
		surprises=$((surprises + 1))
	}
	printf '   %s\n' "$endpoint"

	request='{"project_id":"'"$project"'","topic":"'"$topic"'","idempotency_key":"proposal-1","kind":"proposal","payload":{"title":"rotate the build key","by":"demo"},"max_attempts":5}'
	printf '\n== POST /v1/outbox as %s: a new message, signed with %s (201)\n' "$DEMO_SERVICE" "$DEMO_OUT_KEY_ID"
	api POST /v1/outbox "$request"
	check 201 '"message_ids":\["msg_'
	first=$answer
	message=$(printf '%s' "$answer" | sed -n 's/.*"message_ids":\["\([^"]*\)".*/\1/p')

	printf '\n== the same request again: 200 with the byte-identical envelope and ids\n'
	api POST /v1/outbox "$request"
	check 200 '"message_ids"'
	if [ "$answer" != "$first" ]; then
		printf '   !! the repeat is not byte-identical to the first answer\n'
		surprises=$((surprises + 1))
	fi

	printf '\n== the same idempotency key with other content: idempotency_conflict\n'
	api POST /v1/outbox "${request/rotate the build key/something else}"
	check 422 '"reason":"idempotency_conflict"'

	printf '\n== a topic nobody subscribed to (new key): no_endpoint, and no sequence taken\n'
	nobody=${request/$topic/task.nobody}
	api POST /v1/outbox "${nobody/proposal-1/proposal-2}"
	check 422 '"reason":"no_endpoint"'

	printf '\n== that key on the subscribed topic: sequence 2 (the refusals took none)\n'
	api POST /v1/outbox "${request/proposal-1/proposal-2}"
	check 201 '"sequence":2,'

	printf '\n== GET /v1/outbox/%s until the delivery-worker has delivered it (at most 30 s)\n' "${message:-?}"
	await "$message" delivered dead
	check 200 '"status":"delivered"'

	printf '\n== what the webhook-sink received (.tmp/stack/webhook-sink.log)\n'
	received=$(grep -F "\"webhook_id\":\"${message:-none}\"" "$stack/webhook-sink.log" || true)
	printf '%s\n' "${received:-(nothing)}" | sed 's/^/   /'
	case "$received" in
	*'"result":"accepted"'*'"signature":"verified"'*) ;;
	*) printf '   !! expected an accepted delivery with a verified envelope signature\n'; surprises=$((surprises + 1)) ;;
	esac

	if [ -f "$drafts/operator.header" ] && [ -n "${DEMO_STALE_REF:-}" ]; then
		dead_letter_and_replay
	fi
	rm -f "$drafts/service.header" "$drafts/operator.header"
fi

echo
if [ "$surprises" -gt 0 ]; then
	log "$surprises answer(s) were not what the contract says"
	exit 1
fi
echo "Demo done: every answer was what the contract says."
