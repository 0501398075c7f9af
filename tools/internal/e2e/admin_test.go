package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/buildinfo/buildtest"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// envctlBinary runs the envctl binary built from tools/envctl, with DATABASE_URL=dsn.
type envctlBinary struct{ path string }

func buildEnvctl(t *testing.T) envctlBinary {
	t.Helper()
	return envctlBinary{buildtest.Binary(t, "tools/envctl", t.TempDir())}
}

func (b envctlBinary) run(t *testing.T, dsn string, args ...string) res {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, b.path, args...)
	cmd.Env = append(os.Environ(), "DATABASE_URL="+dsn)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		code = exit.ExitCode()
	} else if err != nil {
		t.Fatalf("envctl %v: %v", args, err)
	}
	return res{code, out.String(), errb.String()}
}

// want checks the exit code and that stderr mentions has.
func (r res) want(t *testing.T, what string, code int, has string) res {
	t.Helper()
	if r.code != code || !strings.Contains(r.stderr, has) {
		t.Fatalf("%s: exit %d, stderr %q (stdout %q); want exit %d mentioning %q", what, r.code, r.stderr, r.stdout, code, has)
	}
	return r
}

// lines decodes one JSON object a line.
func (r res) lines(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q is not one JSON object: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// TestAdminSurfaceThroughTheBinary drives every admin command of issue 16 through the envctl binary on
// an operator-role connection (migrate status on the owner's): each answer, its refusals (bad flags:
// exit 2 with usage; unknown objects: exit 1 naming them) and each -h example.
func TestAdminSurfaceThroughTheBinary(t *testing.T) {
	envctl := buildEnvctl(t)
	dsn := storetest.NewDatabase(t)
	ops := storetest.DSNForRole(dsn, "envelopeworker_operator")
	const tenant = "adm"

	// -h of each new command shows an example; a bad flag is exit 2 with the usage hint.
	for _, p := range [][]string{{"endpoint", "list"}, {"endpoint", "update"}, {"key", "list"}, {"credential", "list"},
		{"migrate", "status"}, {"migrate"}, {"dlq", "replay"}, {"audit", "list"}} {
		r := envctl.run(t, "", append(p, "--help")...).want(t, strings.Join(p, " ")+" --help", 0, "")
		if !strings.Contains(r.stdout, "Example:\n  envctl "+strings.Join(p, " ")) {
			t.Errorf("envctl %s --help shows no example:\n%s", strings.Join(p, " "), r.stdout)
		}
		envctl.run(t, ops, append(p, "--no-such-flag")...).want(t, strings.Join(p, " ")+" --no-such-flag", 2, "-h' for usage")
	}

	// migrate status and --dry-run on a migrated database.
	r := envctl.run(t, dsn, "migrate", "status").want(t, "migrate status", 0, "")
	if st := r.lines(t); len(st) != migrations.Latest() || st[len(st)-1]["state"] != "applied" ||
		st[0]["applied_checksum"] != st[0]["embedded_checksum"] {
		t.Fatalf("migrate status: %q", r.stdout)
	}
	r = envctl.run(t, dsn, "migrate", "--dry-run").want(t, "migrate --dry-run", 0, "dry run: 0 migration(s) would be applied")

	// Endpoints: add, list, update, disable; refusals.
	r = envctl.run(t, ops, "endpoint", "add", "--tenant", tenant, "--project", "p1", "--topic", "x",
		"--url", "https://hooks.example.test/a", "--secret-ref", "adm-hooks").want(t, "endpoint add", 0, "")
	ep := strings.TrimSpace(r.stdout)
	r = envctl.run(t, ops, "endpoint", "update", "--tenant", tenant, "--id", ep, "--url", "https://hooks.example.test/b").want(t, "endpoint update", 0, "")
	if l := r.lines(t); len(l) != 1 || l[0]["url"] != "https://hooks.example.test/b" {
		t.Fatalf("endpoint update: %q", r.stdout)
	}
	envctl.run(t, ops, "endpoint", "disable", "--tenant", tenant, "--id", ep).want(t, "endpoint disable", 0, "")
	r = envctl.run(t, ops, "endpoint", "list", "--tenant", tenant).want(t, "endpoint list", 0, "")
	if l := r.lines(t); len(l) != 1 || l[0]["endpoint_id"] != ep || l[0]["state"] != "disabled" || l[0]["url"] != "https://hooks.example.test/b" {
		t.Fatalf("endpoint list: %q", r.stdout)
	}
	envctl.run(t, ops, "endpoint", "update", "--tenant", tenant, "--id", "ep_000000000000000000000000", "--secret-ref", "r2").
		want(t, "endpoint update of an unknown id", 1, `no endpoint "ep_000000000000000000000000" in tenant adm`)
	envctl.run(t, ops, "endpoint", "update", "--tenant", tenant, "--id", ep).want(t, "endpoint update without a change", 2, "nothing to update")
	envctl.run(t, ops, "endpoint", "enable", "--tenant", tenant, "--id", ep).want(t, "endpoint enable", 0, "")

	// Keys and credentials.
	r = envctl.run(t, "", "keygen", "--seed-file", filepath.Join(t.TempDir(), "seed")).want(t, "keygen", 0, "")
	envctl.run(t, ops, "key", "add", "--tenant", tenant, "--key-id", "k1", "--public-key", strings.TrimSpace(r.stdout)).want(t, "key add", 0, "")
	r = envctl.run(t, ops, "key", "list", "--tenant", tenant).want(t, "key list", 0, "")
	if l := r.lines(t); len(l) != 1 || l[0]["key_id"] != "k1" || l[0]["state"] != "active" {
		t.Fatalf("key list: %q", r.stdout)
	}
	r = envctl.run(t, ops, "credential", "issue", "--tenant", tenant, "--account", "a1", "--device", "ops-1", "--role", "operator").want(t, "credential issue", 0, "")
	token := strings.TrimSpace(r.stdout)
	r = envctl.run(t, ops, "credential", "list", "--tenant", tenant).want(t, "credential list", 0, "")
	creds := r.lines(t)
	if len(creds) != 1 || creds[0]["status"] != "active" || strings.Contains(r.stdout, token) {
		t.Fatalf("credential list: %q", r.stdout)
	}
	envctl.run(t, ops, "credential", "revoke", "--tenant", tenant, "--id", fmt.Sprint(creds[0]["credential_id"])).want(t, "credential revoke", 0, "")
	if l := envctl.run(t, ops, "credential", "list", "--tenant", tenant).lines(t); l[0]["status"] != "revoked" {
		t.Fatalf("credential list after revoke: %v", l)
	}
	envctl.run(t, ops, "credential", "revoke", "--tenant", tenant, "--id", "cred_nope").
		want(t, "credential revoke of an unknown id", 1, `no credential "cred_nope" in tenant adm`)

	// Dead letters: three die with http_5xx; a bulk replay is refused without --dry-run or --yes, shows
	// them dry, replays them with --yes, and audit list finds one replayed row each.
	dead := makeDeadLetters(t, dsn, tenant, "p1", "x", 3)
	envctl.run(t, ops, "dlq", "replay", "--tenant", tenant, "--project", "p1").want(t, "bulk replay without --yes", 2, "exactly one of --dry-run")
	r = envctl.run(t, ops, "dlq", "replay", "--tenant", tenant, "--project", "p1", "--code", "http_5xx", "--dry-run").want(t, "dry run", 0, "dry run: 3 dead letter(s)")
	if l := r.lines(t); len(l) != 3 || l[0]["message_id"] != dead[0] {
		t.Fatalf("dry run: %q", r.stdout)
	}
	since := time.Now().UTC().Add(-time.Second).Format(time.RFC3339Nano)
	r = envctl.run(t, ops, "dlq", "replay", "--tenant", tenant, "--project", "p1", "--code", "http_5xx", "--yes", "--pace", "10ms", "--account", "a1").
		want(t, "bulk replay", 0, "replayed 3, skipped 0, failed 0")
	if l := r.lines(t); len(l) != 3 || l[2]["status"] != "pending" {
		t.Fatalf("bulk replay: %q", r.stdout)
	}
	r = envctl.run(t, ops, "audit", "list", "--tenant", tenant, "--outcome", "replayed", "--since", since, "--limit", "2").want(t, "audit list", 0, "next_after ")
	page1 := r.lines(t)
	after := strings.TrimSpace(strings.TrimPrefix(r.stderr, "next_after "))
	r = envctl.run(t, ops, "audit", "list", "--tenant", tenant, "--outcome", "replayed", "--after", after).want(t, "audit list page 2", 0, "")
	if page2 := r.lines(t); len(page1) != 2 || len(page2) != 1 || page1[0]["account_id"] != "a1" {
		t.Fatalf("audit list of the replays: %v then %v", page1, page2)
	}
	envctl.run(t, ops, "audit", "list", "--tenant", tenant, "--since", "yesterday").want(t, "audit list --since yesterday", 2, "not an RFC 3339 time")
}

// makeDeadLetters enqueues n messages to the project's topic through the store and lets each die with
// http_5xx, oldest first.
func makeDeadLetters(t *testing.T, dsn, tenant, project, topic string, n int) []string {
	t.Helper()
	s := storetest.Open(t, dsn)
	ctx := context.Background()
	a := store.Actor{TenantID: tenant, AccountID: "a1", DeviceID: "svc1", CorrelationID: "e2e"}
	var ids []string
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("dead-%d", i)
		res, err := s.Outbox().Enqueue(ctx, a, store.EnqueueRequest{
			ProjectID: project, ProducerID: "svc1", Topic: topic,
			IdempotencyDigest: sha256.Sum256([]byte(key)), RequestDigest: sha256.Sum256([]byte(key)), MaxAttempts: 1,
			Build: func(seq int64) ([]byte, string, error) {
				nonce := make([]byte, 16)
				_, _ = rand.Read(nonce)
				sum := sha256.Sum256(nonce)
				return []byte(fmt.Sprintf(`{"sequence":%d}`, seq)), hex.EncodeToString(sum[:]), nil
			},
		})
		if err != nil || len(res.MessageIDs) != 1 {
			t.Fatalf("enqueue: %v %+v", err, res)
		}
		ids = append(ids, res.MessageIDs[0])
	}
	cs, err := s.Outbox().Claim(ctx, tenant, store.MaxClaim, time.Minute)
	if err != nil || len(cs) != n {
		t.Fatalf("claim: %d, %v", len(cs), err)
	}
	for _, id := range ids {
		if err := s.Outbox().MarkDead(ctx, tenant, id, 1, store.CodeHTTP5xx, false); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}
