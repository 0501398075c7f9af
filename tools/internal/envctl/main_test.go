package envctl

import (
	"bytes"
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

type result struct {
	code           int
	stdout, stderr string
}

// run executes envctl in-process with DATABASE_URL=dsn (empty: unset).
func run(t *testing.T, dsn string, args ...string) result {
	t.Helper()
	return runEnv(t, Env{Getenv: envOf(map[string]string{"DATABASE_URL": dsn})}, args...)
}

func runEnv(t *testing.T, env Env, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	env.Stdout, env.Stderr = &out, &errb
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code := Run(ctx, args, env)
	return result{code: code, stdout: out.String(), stderr: errb.String()}
}

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// expect checks the exit code and that stderr mentions want (for refusals) or is free of "envctl" error
// lines (for successes).
func (r result) expect(t *testing.T, code int, stderrHas string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit code %d, want %d\nstdout: %s\nstderr: %s", r.code, code, r.stdout, r.stderr)
	}
	if stderrHas != "" && !bytes.Contains([]byte(r.stderr), []byte(stderrHas)) {
		t.Fatalf("stderr %q does not mention %q", r.stderr, stderrHas)
	}
}
