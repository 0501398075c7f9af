package telemetry

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestWanted(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		on   bool
		err  string // the variable the error must name; "" for none
	}{
		{"nothing set", nil, false, ""},
		{"endpoint", map[string]string{EnvEndpoint: "http://collector:4318"}, true, ""},
		{"traces endpoint", map[string]string{EnvTracesEndpoint: "http://collector:4318/v1/traces"}, true, ""},
		{"exporter otlp", map[string]string{EnvTracesExporter: "otlp"}, true, ""},
		{"exporter none beats endpoint", map[string]string{EnvTracesExporter: "none", EnvEndpoint: "http://c:4318"}, false, ""},
		{"sdk disabled beats exporter", map[string]string{EnvSDKDisabled: "true", EnvTracesExporter: "otlp"}, false, ""},
		{"sdk disabled false", map[string]string{EnvSDKDisabled: "false", EnvTracesExporter: "otlp"}, true, ""},
		{"other exporter", map[string]string{EnvTracesExporter: "zipkin"}, false, EnvTracesExporter},
		{"console exporter", map[string]string{EnvTracesExporter: "console", EnvEndpoint: "http://c:4318"}, false, EnvTracesExporter},
		{"http protobuf", map[string]string{EnvEndpoint: "http://c:4318", EnvProtocol: "http/protobuf"}, true, ""},
		{"grpc refused", map[string]string{EnvEndpoint: "http://c:4317", EnvProtocol: "grpc"}, false, EnvProtocol},
		{"traces protocol refused", map[string]string{EnvTracesExporter: "otlp", EnvTracesProtocol: "http/json"}, false, EnvTracesProtocol},
		{"traces protocol wins", map[string]string{EnvTracesExporter: "otlp", EnvTracesProtocol: "http/protobuf", EnvProtocol: "grpc"}, true, ""},
		{"protocol ignored when off", map[string]string{EnvProtocol: "grpc"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			on, err := wanted(env(tc.env))
			if tc.err != "" {
				if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want ErrConfig naming %s", err, tc.err)
				}
				return
			}
			if err != nil || on != tc.on {
				t.Fatalf("wanted = %v, %v; want %v, nil", on, err, tc.on)
			}
		})
	}
}

func TestSetupOffIsNoop(t *testing.T) {
	p, err := Setup(context.Background(), "svc", "v0", env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if p.Enabled() {
		t.Fatal("enabled without any OTEL_* variable")
	}
	_, span := p.Tracer("t").Start(context.Background(), "x")
	if span.IsRecording() || span.SpanContext().IsValid() {
		t.Fatal("the disabled provider made a real span")
	}
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := Setup(context.Background(), "svc", "v0", env(map[string]string{EnvTracesExporter: "jaeger"})); !errors.Is(err, ErrConfig) {
		t.Fatalf("unsupported exporter: err = %v", err)
	}
}

// TestSetupExportsOverHTTP runs the real exporter against a collector
// stand-in: spans reach it at the configured endpoint when Shutdown flushes,
// with the default service name unless OTEL_SERVICE_NAME overrides it.
func TestSetupExportsOverHTTP(t *testing.T) {
	var mu sync.Mutex
	var bodies [][]byte
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		bodies, paths = append(bodies, b), append(paths, r.URL.Path+" "+r.Header.Get("Content-Type"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	defer srv.Close()
	t.Setenv(EnvEndpoint, srv.URL)
	t.Setenv("OTEL_SERVICE_NAME", "")
	t.Setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test-env")

	p, err := Setup(context.Background(), "svc-default-name", "v9", func(k string) string { return map[string]string{EnvEndpoint: srv.URL}[k] })
	if err != nil {
		t.Fatal(err)
	}
	if !p.Enabled() {
		t.Fatal("not enabled with an endpoint set")
	}
	_, span := p.Tracer("t").Start(context.Background(), "exported-span-name")
	span.End()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := p.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bodies) != 1 || paths[0] != "/v1/traces application/x-protobuf" {
		t.Fatalf("collector saw %q", paths)
	}
	for _, want := range []string{"exported-span-name", "svc-default-name", "v9", "test-env"} {
		if !bytes.Contains(bodies[0], []byte(want)) {
			t.Errorf("exported spans lack %q", want)
		}
	}
}

func TestTraceparentRoundTrip(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := WithParent(context.Background(), tp)
	if got := Traceparent(ctx); got != tp {
		t.Fatalf("Traceparent = %q, want %q", got, tp)
	}
	// With tracing off the parent is carried forward unchanged.
	nctx, _ := Disabled().Tracer("t").Start(ctx, "x")
	if got := Traceparent(nctx); got != tp {
		t.Fatalf("through the no-op tracer: %q, want %q", got, tp)
	}
	h := http.Header{}
	Inject(nctx, h)
	if h.Get(HeaderTraceparent) != tp || len(h) != 1 {
		t.Fatalf("Inject set %v", h)
	}
	// With tracing on a child keeps the trace id and gets its own span id.
	rec := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer func() { _ = sdk.Shutdown(context.Background()) }()
	sctx, span := FromSDK(sdk).Tracer("t").Start(ctx, "child")
	span.End()
	got := Traceparent(sctx)
	if !strings.HasPrefix(got, tp[:36]) || got == tp || !strings.HasSuffix(got, "-01") {
		t.Fatalf("child traceparent %q of %q", got, tp)
	}
	if ended := rec.Ended(); len(ended) != 1 || ended[0].Parent().SpanID().String() != "00f067aa0ba902b7" || !ended[0].Parent().IsRemote() {
		t.Fatalf("child's parent is not the remote traceparent")
	}
}

func TestWithParentIgnoresInvalid(t *testing.T) {
	for _, tp := range []string{
		"",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", // upper case
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01", // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", // zero parent id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",    // no flags
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", // forbidden version
		"not a traceparent",
	} {
		ctx := WithParent(context.Background(), tp)
		if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
			t.Errorf("%q became a parent", tp)
		}
		if got := Traceparent(ctx); got != "" {
			t.Errorf("%q: Traceparent = %q", tp, got)
		}
	}
}
