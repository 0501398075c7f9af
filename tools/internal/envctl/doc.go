// Package envctl is the operator command line of envelopeworker: everything `envctl` does, driven by
// Run so tests can call each command in-process against a real PostgreSQL and check its output and exit
// code. tools/envctl/main.go only wires the process (arguments, signals, exit status) to Run.
//
// Commands (contract §6, plus additions marked +):
//
//	envctl migrate [--dry-run] [--layout plain|partitioned]               (+ --dry-run)
//	envctl migrate status                                                (+)
//	envctl credential issue --tenant T --account A --device D --role device|service|operator
//	envctl credential list --tenant T [--limit N] [--after ID]           (+)
//	envctl credential revoke --tenant T --id ID                          (+)
//	envctl key add --tenant T --key-id K --public-key B64URL
//	envctl key list --tenant T [--limit N] [--after K]                   (+)
//	envctl key retire|revoke --tenant T --key-id K
//	envctl key prune [--replay-window 2160h]
//	envctl stream set-floor --tenant T --project P --producer D --floor N
//	envctl stream show --tenant T --project P --producer D               (+)
//	envctl audit list --tenant T [--project P] [--outcome O] [--since T] [--until T] [--limit N] [--after C]
//	envctl send --url U --token-file F --seed-file F --file DRAFT [--batch] (+, the reference producer)
//	envctl keygen [--seed-file F]                                        (+)
//	envctl endpoint add --tenant T --project P --topic X --url URL --secret-ref NAME
//	envctl endpoint list --tenant T [--project P] [--limit N] [--after E] (+)
//	envctl endpoint update --tenant T --id E [--url URL] [--secret-ref NAME] (+)
//	envctl endpoint enable|disable --tenant T --id E
//	envctl endpoint show --tenant T --id E                               (+)
//	envctl dlq list --tenant T --project P [--limit N] [--after CURSOR]
//	envctl dlq replay --tenant T --id M [--account A]                    (+ --account)
//	envctl dlq replay --tenant T --project P [--endpoint E] [--code C] [--since T] [--limit N]
//	                  [--pace D] --dry-run|--yes [--account A]           (+, bulk)
//	envctl outbox show --tenant T --id M                                 (+)
//	envctl outbox attempts --tenant T --id M                             (§8.8)
//	envctl verify                                                        (+)
//	envctl outbox backfill-bodies [--batch N] [--pause D] [--retention D] (+, migration 0008's backfill)
//
// Every database command reads DATABASE_URL, or --database-url, and gives up after --timeout.
//
// Output is for scripts: a command that creates a thing prints that thing alone on stdout (the token,
// the public key); listings print one JSON object per line; commentary goes to stderr, including the
// "next_after <cursor>" of a full page, which --after takes. Every command's -h ends with an example.
//
// A draft file for send is an envelope without "signature", read strictly (duplicate or unknown members
// are errors, so a typo is never silently dropped from what gets signed). Two conveniences: "issued_at"
// may be "now" or left out (the signing time, whole seconds, UTC) and "schema_version" may be left out
// (it is always 1). With --batch the file is {"envelopes":[draft, ...]} or a bare array of drafts.
// send prints "HTTP <status>" and the answer body; a non-2xx answer is exit code 1.
//
//	{"tenant_id":"demo","project_id":"proj-1","producer_id":"device-1","event_id":"evt-1",
//	 "idempotency_key":"idem-1","key_id":"demo-key-1","sequence":1,"issued_at":"now",
//	 "metadata":{"kind":"task.status"},"payload":{"state":"running"}}
//
// Exit codes, so scripts can tell a typo from a refusal:
//
//	0  done
//	1  refused or failed after reaching the database or the service (existing key id, lowering a
//	   floor, unknown key, database unavailable, a non-2xx answer to send)
//	2  the command line itself is wrong: unknown command or flag, a missing or malformed value
//	   (including a public key that is not 32 bytes, not canonical, or of small order); nothing was
//	   attempted
//
// Secrets: tokens are printed only by `credential issue` (once; only the digest is stored), seeds only
// by `keygen` without --seed-file. Nothing else echoes a token, seed, signature or payload, and error
// messages from the store never carry SQL or driver text.
//
// Outbox: `endpoint add` validates the URL before it reaches the database (https, no user info, no
// fragment; http only for loopback hosts, which the worker still refuses unless
// DELIVERY_ALLOW_INSECURE_LOOPBACK is set) and never echoes a refused URL, since it may carry a
// password. --secret-ref is the name of the endpoint's secrets in the worker's WEBHOOK_SECRETS_FILE; a
// value starting with "whsec_" or "whsk_" is refused as a secret pasted by mistake. A secret ref
// belongs to the first tenant whose endpoint names it (migration 0005): another tenant's `endpoint add`
// is refused (exit 1) without naming the owner. A topic has at most store.MaxTopicEndpoints (64)
// active endpoints: `endpoint add` of one more, and `endpoint enable` that would make one more, are
// refused (exit 1) with a message naming the topic and the bound. `migrate` lists the refs that
// belong to no tenant because several shared them before 0005. `endpoint disable`
// records the reason "operator" (the worker records "http_410"); `endpoint enable` clears it. `dlq list`
// prints the members of GET /v1/dead-letters entries; when more remain it writes "next_after <cursor>"
// to stderr, to pass back as --after. `dlq replay` prints the status object of GET /v1/outbox/{id}
// (last_error_code, next_attempt_at and delivered_at are null when unset) and audits the replay with
// outcome "replayed", a correlation id "envctl-<hex>" (printed on stderr) and --account as account_id;
// replaying a message that is not dead is exit 1 and names its status. `outbox show` prints the same
// status object for any message; `outbox attempts` prints its latest 100 delivery attempts, oldest
// first, one line each, with the members of GET /v1/outbox/{id}/attempts entries (attempt, started_at,
// duration_ms, http_status or null, error_code or null, result: delivered, retry, dead or
// lease_expired); a message never attempted prints nothing on stdout and says so on stderr. Both
// need only the operator role; an unknown id, or another tenant's, is exit 1.
//
// `verify` checks, in one read-only snapshot, the cross-table invariants a restore must keep (see
// verify.go and `envctl verify -h`), prints "<invariant> <violating rows>" for each, and exits 1 when
// any count is not 0. It needs to read every envelope table: run it as the database owner.
package envctl
