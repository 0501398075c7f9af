package app

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/telemetry"
)

// A tracing configuration this build cannot honour stops the worker at
// start with a message naming the variable, rather than running untraced.
func TestRunRefusesUnsupportedTracing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.json")
	if err := os.WriteFile(p, []byte(`{"ep":["`+secret(1)+`"]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, value := range map[string]string{
		telemetry.EnvTracesExporter: "console",
		telemetry.EnvTracesProtocol: "http/json",
	} {
		env := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x?sslmode=disable&connect_timeout=1",
			"WEBHOOK_SECRETS_FILE": p, telemetry.EnvTracesEndpoint: "http://127.0.0.1:1/v1/traces", name: value}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := Run(ctx, nil, func(k string) string { return env[k] }, io.Discard, nil)
		cancel()
		if !errors.Is(err, telemetry.ErrConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: err = %v, want telemetry.ErrConfig naming it", name, value, err)
		}
	}
}
