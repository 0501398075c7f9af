package envctl

import (
	"strings"
	"testing"
)

// Every command and subcommand answers -h with its usage on stdout and exit 0, without needing a
// database.
func TestHelpEverywhere(t *testing.T) {
	var paths [][]string
	var walk func(prefix []string, cmds []*command)
	walk = func(prefix []string, cmds []*command) {
		for _, c := range cmds {
			p := append(append([]string(nil), prefix...), c.name)
			paths = append(paths, p)
			walk(p, c.subs)
		}
	}
	walk(nil, commands())
	if len(paths) < 14 {
		t.Fatalf("only %d commands found", len(paths))
	}
	for _, p := range append(paths, []string{}) {
		for _, h := range []string{"-h", "--help"} {
			args := append(append([]string(nil), p...), h)
			r := run(t, "", args...)
			r.expect(t, ExitOK, "")
			if !strings.Contains(r.stdout, "Usage: envctl") || r.stderr != "" {
				t.Errorf("envctl %s: stdout %q stderr %q", strings.Join(args, " "), r.stdout, r.stderr)
			}
		}
	}
	r := run(t, "", "key", "add", "-h")
	for _, f := range []string{"-tenant", "-key-id", "-public-key", "-database-url", "-timeout"} {
		if !strings.Contains(r.stdout, f) {
			t.Errorf("key add -h does not list %s:\n%s", f, r.stdout)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		args []string
		msg  string
	}{
		{nil, "Usage: envctl <command>"},
		{[]string{"frobnicate"}, `unknown command "frobnicate"`},
		{[]string{"key"}, "Usage: envctl key <command>"},
		{[]string{"key", "rotate"}, `unknown command "rotate"`},
		{[]string{"migrate", "--bogus"}, "flag provided but not defined: -bogus"},
		{[]string{"migrate", "extra"}, `unexpected argument "extra"`},
		{[]string{"migrate"}, "DATABASE_URL is not set"},
		{[]string{"audit", "list", "--tenant", "t1"}, "DATABASE_URL is not set"},
		{[]string{"migrate", "--database-url", "postgres://x", "--timeout", "0s"}, "--timeout must be positive"},
		{[]string{"credential", "issue", "--tenant", "t1", "--account", "a1", "--device", "d1"}, "--role is required"},
		{[]string{"credential", "issue", "--tenant", "t1", "--account", "a1", "--role", "device"}, "--device is required"},
		{[]string{"credential", "issue", "--tenant", "t1", "--account", "a1", "--device", "d1", "--role", "admin"}, `--role "admin" is not one of`},
		{[]string{"credential", "issue", "--tenant", "-t1", "--account", "a1", "--device", "d1", "--role", "device"}, `--tenant "-t1" is not a valid identity`},
		{[]string{"credential", "revoke", "--tenant", "t1"}, "--id is required"},
		{[]string{"credential", "revoke", "--tenant", "t1", "--id", strings.Repeat("c", 65)}, "--id is longer than 64 bytes"},
		// Every command on one object of a tenant refuses alike (objectFlags).
		{[]string{"credential", "revoke", "--id", "cred_1"}, "--tenant is required"},
		{[]string{"credential", "revoke", "--tenant", "t 1", "--id", "cred_1"}, `--tenant "t 1" is not a valid identity`},
		{[]string{"endpoint", "update", "--tenant", "t1", "--id", strings.Repeat("e", 65), "--url", "https://h.test/"}, "--id is longer than 64 bytes: not an endpoint id"},
		{[]string{"endpoint", "disable", "--id", "ep_1"}, "--tenant is required"},
		{[]string{"endpoint", "show", "--tenant", "t1", "--id", "ep_1", "extra"}, `unexpected argument "extra"`},
		{[]string{"outbox", "show", "--tenant", "t1", "--id", strings.Repeat("m", 65)}, "--id is longer than 64 bytes: not a message id"},
		{[]string{"outbox", "attempts", "--tenant", "-t", "--id", "msg_1"}, `--tenant "-t" is not a valid identity`},
		{[]string{"credential", "revoke", "--tenant", "t1", "--id", strings.Repeat("c", 65)}, "not a credential id"},
		{[]string{"key", "add", "--tenant", "t1", "--key-id", "k1"}, "--public-key is required"},
		{[]string{"key", "retire", "--tenant", "t1"}, "--key-id is required"},
		{[]string{"key", "prune", "--replay-window", "-1h"}, "--replay-window must be positive"},
		{[]string{"key", "prune", "--replay-window", "soon"}, "invalid value"},
		{[]string{"stream", "set-floor", "--tenant", "t1", "--project", "p1", "--producer", "d1"}, "--floor is required"},
		{[]string{"stream", "set-floor", "--tenant", "t1", "--project", "p1", "--producer", "d1", "--floor", "-1"}, "must be an integer from 0 to 9007199254740991"},
		{[]string{"stream", "set-floor", "--tenant", "t1", "--project", "p1", "--producer", "d1", "--floor", "9007199254740992"}, "must be an integer from 0"},
		{[]string{"stream", "set-floor", "--tenant", "t1", "--project", "p1", "--producer", "d1", "--floor", "1.0"}, "must be an integer from 0"},
		{[]string{"stream", "show", "--tenant", "t1", "--project", "p/1", "--producer", "d1"}, `--project "p/1" is not a valid identity`},
		{[]string{"audit", "list"}, "--tenant is required"},
		{[]string{"audit", "list", "--tenant", "t1", "--limit", "0"}, "--limit 0 is outside 1-1000"},
		{[]string{"audit", "list", "--tenant", "t1", "--limit", "1001"}, "--limit 1001 is outside 1-1000"},
		{[]string{"audit", "list", "--tenant", "t1", "--project", "p 1"}, `--project "p 1" is not a valid identity`},
	}
	for _, c := range cases {
		r := run(t, "", c.args...)
		if r.code != ExitUsage || !strings.Contains(r.stderr, c.msg) || r.stdout != "" {
			t.Errorf("envctl %s: code %d stdout %q stderr %q; want exit 2 mentioning %q",
				strings.Join(c.args, " "), r.code, r.stdout, r.stderr, c.msg)
		}
	}
}

func TestReplayWindowFromEnvironment(t *testing.T) {
	r := runEnv(t, Env{Getenv: envOf(map[string]string{"DATABASE_URL": "postgres://x", "REPLAY_WINDOW": "ninety days"})},
		"key", "prune")
	r.expect(t, ExitUsage, `REPLAY_WINDOW "ninety days" is not a Go duration`)
}
