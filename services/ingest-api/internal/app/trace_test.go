package app

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/telemetry"
)

// A tracing configuration this build cannot honour stops the binary at
// start with a message naming the variable, rather than running untraced.
func TestRunRefusesUnsupportedTracing(t *testing.T) {
	for name, value := range map[string]string{
		telemetry.EnvTracesExporter: "zipkin",
		telemetry.EnvProtocol:       "grpc",
	} {
		env := map[string]string{"DATABASE_URL": "postgres://postgres@127.0.0.1:1/x?sslmode=disable",
			telemetry.EnvEndpoint: "http://127.0.0.1:1", name: value}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := Run(ctx, nil, func(k string) string { return env[k] }, io.Discard, nil)
		cancel()
		if !errors.Is(err, telemetry.ErrConfig) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s=%s: err = %v, want telemetry.ErrConfig naming it", name, value, err)
		}
	}
}
