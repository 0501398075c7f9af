module github.com/envelopeworker/envelopeworker/services/delivery-worker

go 1.26.0

replace (
	github.com/envelopeworker/envelopeworker/migrations => ../../migrations
	github.com/envelopeworker/envelopeworker/modules/envelope => ../../modules/envelope
	github.com/envelopeworker/envelopeworker/modules/limiter => ../../modules/limiter
	github.com/envelopeworker/envelopeworker/modules/receiver => ../../modules/receiver
	github.com/envelopeworker/envelopeworker/modules/store => ../../modules/store
)

require (
	github.com/envelopeworker/envelopeworker/migrations v0.1.0
	github.com/envelopeworker/envelopeworker/modules/buildinfo v0.1.0
	github.com/envelopeworker/envelopeworker/modules/envflag v0.1.0
	github.com/envelopeworker/envelopeworker/modules/httpserve v0.1.0
	github.com/envelopeworker/envelopeworker/modules/limiter v0.1.0
	github.com/envelopeworker/envelopeworker/modules/receiver v0.1.0
	github.com/envelopeworker/envelopeworker/modules/store v0.1.0
	github.com/hashicorp/go-retryablehttp v0.7.8
	github.com/prometheus/client_golang v1.23.2
	github.com/standard-webhooks/standard-webhooks/libraries v0.0.1
	go.opentelemetry.io/otel v1.47.0
	go.opentelemetry.io/otel/sdk v1.47.0
	go.opentelemetry.io/otel/trace v1.47.0
	go.uber.org/goleak v1.3.0
	golang.org/x/net v0.59.0
)

require (
	github.com/cenkalti/backoff/v5 v5.0.3 // indirect
	github.com/go-logr/logr v1.4.4 // indirect
	github.com/go-logr/stdr v1.2.2 // indirect
	github.com/google/uuid v1.6.0 // indirect
	github.com/grpc-ecosystem/grpc-gateway/v2 v2.30.0 // indirect
	go.opentelemetry.io/auto/sdk v1.2.1 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace v1.47.0 // indirect
	go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp v1.47.0 // indirect
	go.opentelemetry.io/otel/log v1.47.0 // indirect
	go.opentelemetry.io/otel/metric v1.47.0 // indirect
	go.opentelemetry.io/proto/otlp v1.11.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/grpc v1.83.2 // indirect
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/envelopeworker/envelopeworker/modules/envelope v0.1.0
	github.com/envelopeworker/envelopeworker/modules/telemetry v0.1.0
	github.com/hashicorp/go-cleanhttp v0.5.2 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.7.6 // indirect
	github.com/jackc/puddle/v2 v2.2.2 // indirect
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/kylelemons/godebug v1.1.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.66.1 // indirect
	github.com/prometheus/procfs v0.19.2 // indirect
	github.com/puzpuzpuz/xsync/v3 v3.5.1 // indirect
	github.com/sethvargo/go-limiter v0.7.1 // indirect
	github.com/tmthrgd/go-hex v0.0.0-20190904060850-447a3041c3bc // indirect
	github.com/uptrace/bun v1.2.16 // indirect
	github.com/uptrace/bun/dialect/pgdialect v1.2.16 // indirect
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/crypto v0.57.0 // indirect
	golang.org/x/sync v0.23.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.42.0 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

replace github.com/envelopeworker/envelopeworker/modules/buildinfo => ../../modules/buildinfo

replace github.com/envelopeworker/envelopeworker/modules/envflag => ../../modules/envflag

replace github.com/envelopeworker/envelopeworker/modules/httpserve => ../../modules/httpserve

replace github.com/envelopeworker/envelopeworker/modules/telemetry => ../../modules/telemetry
