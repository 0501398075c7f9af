// Package telemetry is the one home of envelopeworker's OpenTelemetry
// tracing: whether a binary traces at all (decided from the standard OTEL_*
// variables), the tracer provider and its flush at shutdown, how a W3C
// traceparent becomes a span parent and back, and the names of the span
// attributes the binaries set.
//
// Tracing is off unless the environment configures an exporter: then every
// tracer is OpenTelemetry's no-op, which starts no span and allocates
// nothing, but still carries a parent's span context forward, so that a
// traceparent that came in (an envelope's metadata.traceparent, a request
// header) goes out again unchanged with tracing off.
//
// It is a module of its own, not part of modules/buildinfo, because the
// OpenTelemetry SDK and its OTLP exporter are a dependency tree (gRPC status
// codes, protobuf) that the binaries which do not trace (envctl, the
// retention-janitor) should not carry.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// The standard variables that decide whether tracing is on. The SDK and the
// exporter read the rest themselves (endpoint, headers, timeout, sampler,
// resource attributes).
const (
	EnvSDKDisabled         = "OTEL_SDK_DISABLED"
	EnvTracesExporter      = "OTEL_TRACES_EXPORTER"
	EnvEndpoint            = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvTracesEndpoint      = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvProtocol            = "OTEL_EXPORTER_OTLP_PROTOCOL"
	EnvTracesProtocol      = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
	exporterOTLP           = "otlp"
	exporterNone           = "none"
	protocolHTTPProtobuf   = "http/protobuf"
	instrumentationVersion = "1"
)

// ErrConfig reports OTEL_* settings this build cannot honour; the message
// names the variable.
var ErrConfig = errors.New("telemetry: unsupported tracing configuration")

// Provider is a binary's tracer provider: the SDK's when tracing is on,
// the no-op one otherwise.
type Provider struct {
	tp       trace.TracerProvider
	shutdown func(context.Context) error
	enabled  bool
}

// Disabled is the provider of a binary that does not trace (and of tests
// that do not look at spans).
func Disabled() *Provider {
	return &Provider{tp: noop.NewTracerProvider(), shutdown: func(context.Context) error { return nil }}
}

// FromSDK wraps an SDK provider built elsewhere (tests: one over
// tracetest's in-memory exporter). Shutdown of the result does not shut tp
// down; its owner does.
func FromSDK(tp *sdktrace.TracerProvider) *Provider {
	return &Provider{tp: tp, shutdown: func(context.Context) error { return nil }, enabled: true}
}

// Enabled says whether spans are recorded and exported, so that callers can
// skip the work of preparing one when they are not.
func (p *Provider) Enabled() bool { return p.enabled }

// Tracer is the named tracer of a binary's package.
func (p *Provider) Tracer(name string) trace.Tracer {
	return p.tp.Tracer(name, trace.WithInstrumentationVersion(instrumentationVersion))
}

// FlushTimeout bounds Shutdown: a collector that does not answer must not
// hold a terminating binary past its grace.
const FlushTimeout = 5 * time.Second

// Shutdown flushes the spans still queued and stops the exporter, within
// FlushTimeout. ctx's values are kept but not its cancellation: at shutdown
// ctx is usually the signal's context, already done.
func (p *Provider) Shutdown(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FlushTimeout)
	defer cancel()
	if err := p.shutdown(ctx); err != nil {
		return fmt.Errorf("telemetry: flush spans: %w", err)
	}
	return nil
}

// ShutdownLogged is Shutdown for a binary's deferred last step: spans that
// could not be flushed are a warning on log, not a failure of the run.
func (p *Provider) ShutdownLogged(ctx context.Context, log *slog.Logger) {
	if err := p.Shutdown(ctx); err != nil {
		log.Warn("spans not flushed", slog.String("error", err.Error()))
	}
}

// Setup decides from the environment given by getenv whether the binary
// traces, and builds the provider. Tracing is on when OTEL_TRACES_EXPORTER
// is "otlp", or when it is unset and an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set; OTEL_TRACES_EXPORTER=none or OTEL_SDK_DISABLED=true turn it off.
// Only OTLP over HTTP (protobuf) is built in: another exporter or protocol
// is an error, not a silent no-op, so a deployment that asked for traces
// learns at start that it gets none.
//
// service and version are the resource's service.name and service.version
// unless OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES say otherwise. The
// exporter itself reads OTEL_EXPORTER_OTLP_* (endpoint, headers,
// timeout, …) from the process environment, and the SDK reads
// OTEL_TRACES_SAMPLER(_ARG) (default: parentbased_always_on).
func Setup(ctx context.Context, service, version string, getenv func(string) string) (*Provider, error) {
	on, err := wanted(getenv)
	if err != nil || !on {
		return Disabled(), err
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
	}
	res, err := resource.New(ctx,
		// Later detectors win: the environment overrides the defaults.
		resource.WithAttributes(semconv.ServiceName(service), semconv.ServiceVersion(version)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return &Provider{tp: tp, shutdown: tp.Shutdown, enabled: true}, nil
}

// wanted is Setup's decision, without building anything.
func wanted(getenv func(string) string) (bool, error) {
	if strings.EqualFold(strings.TrimSpace(getenv(EnvSDKDisabled)), "true") {
		return false, nil
	}
	on := false
	switch exp := strings.TrimSpace(getenv(EnvTracesExporter)); exp {
	case exporterNone:
		return false, nil
	case exporterOTLP:
		on = true
	case "":
		on = getenv(EnvEndpoint) != "" || getenv(EnvTracesEndpoint) != ""
	default:
		// Not echoed: a value nobody could mean is no help in the message,
		// and the name of the variable is.
		return false, fmt.Errorf("%w: %s must be %q or %q", ErrConfig, EnvTracesExporter, exporterOTLP, exporterNone)
	}
	if !on {
		return false, nil
	}
	for _, name := range []string{EnvTracesProtocol, EnvProtocol} {
		if p := strings.TrimSpace(getenv(name)); p != "" {
			if p != protocolHTTPProtobuf {
				return false, fmt.Errorf("%w: %s must be %q (the only OTLP protocol built in)", ErrConfig, name, protocolHTTPProtobuf)
			}
			break // the traces-specific one, when set, is the one that counts
		}
	}
	return true, nil
}
