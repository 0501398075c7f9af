module github.com/envelopeworker/envelopeworker/services/retention-janitor

go 1.26

require (
	github.com/envelopeworker/envelopeworker/migrations v0.1.0
	github.com/envelopeworker/envelopeworker/modules/buildinfo v0.1.0
	github.com/envelopeworker/envelopeworker/modules/envflag v0.1.0
	github.com/envelopeworker/envelopeworker/modules/redact v0.1.0
	github.com/envelopeworker/envelopeworker/modules/store v0.1.0
	github.com/jackc/pgx/v5 v5.7.6
	github.com/prometheus/client_golang v1.23.2
	github.com/prometheus/client_model v0.6.2
	github.com/prometheus/common v0.66.1
	go.uber.org/goleak v1.3.0
)

require (
	filippo.io/edwards25519 v1.1.0 // indirect
	github.com/beorn7/perks v1.0.1 // indirect
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/envelopeworker/envelopeworker/modules/envelope v0.1.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/puddle/v2 v2.2.2 // indirect
	github.com/jinzhu/inflection v1.0.0 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	github.com/prometheus/procfs v0.16.1 // indirect
	github.com/puzpuzpuz/xsync/v3 v3.5.1 // indirect
	github.com/tmthrgd/go-hex v0.0.0-20190904060850-447a3041c3bc // indirect
	github.com/uptrace/bun v1.2.16 // indirect
	github.com/uptrace/bun/dialect/pgdialect v1.2.16 // indirect
	github.com/vmihailenco/msgpack/v5 v5.4.1 // indirect
	github.com/vmihailenco/tagparser/v2 v2.0.0 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/crypto v0.37.0 // indirect
	golang.org/x/sync v0.16.0 // indirect
	golang.org/x/sys v0.38.0 // indirect
	golang.org/x/text v0.28.0 // indirect
	google.golang.org/protobuf v1.36.8 // indirect
)

replace (
	github.com/envelopeworker/envelopeworker/migrations => ../../migrations
	github.com/envelopeworker/envelopeworker/modules/envelope => ../../modules/envelope
	github.com/envelopeworker/envelopeworker/modules/redact => ../../modules/redact
	github.com/envelopeworker/envelopeworker/modules/store => ../../modules/store
)

replace github.com/envelopeworker/envelopeworker/modules/buildinfo => ../../modules/buildinfo

replace github.com/envelopeworker/envelopeworker/modules/envflag => ../../modules/envflag
