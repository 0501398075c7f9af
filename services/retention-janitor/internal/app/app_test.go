package app

import (
	"context"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/config"
)

func TestRunHelpGoesToStdout(t *testing.T) {
	var stdout strings.Builder
	err := Run(context.Background(), []string{"-h"}, func(string) string { return "" }, &stdout)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("err = %v, want flag.ErrHelp", err)
	}
	if !strings.Contains(stdout.String(), "-janitor-timeout") {
		t.Fatalf("help went astray: stdout %q", stdout.String())
	}
}

// A refused setting stops the run before any database work or log line.
func TestRunRefusesABadSettingBeforeRunning(t *testing.T) {
	var stdout strings.Builder
	env := map[string]string{"DATABASE_URL": "postgres://j:pw-x@127.0.0.1:1/none", "JANITOR_BATCH_SIZE": "0"}
	err := Run(context.Background(), nil, func(k string) string { return env[k] }, &stdout)
	if !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "JANITOR_BATCH_SIZE") {
		t.Fatalf("err = %v, want ErrInvalid naming JANITOR_BATCH_SIZE", err)
	}
	if stdout.Len() != 0 {
		t.Fatalf("a refused configuration wrote %q", stdout.String())
	}
}
