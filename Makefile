# The two set-up commands of the README are `make up` and `make test`; everything else is a convenience.
SHELL := /usr/bin/env bash
.DEFAULT_GOAL := help

.PHONY: help up down test fuzz lint tidy build bench-envelope bench-store bench-ingest bench-outbox bench-janitor bench-delivery bench-growth soak chaos

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

up: ## bring the whole stack up locally and show it working
	scripts/up.sh

down: ## stop what `make up` started and drop its demo database
	scripts/down.sh

test: ## vet and tests (-race where goroutines run) of every go.work module, against a real PostgreSQL; fuzz seeds as tests
	scripts/test.sh

fuzz: ## fuzz every target for FUZZTIME (default 10m) each: envelope reader, producer answers, ingest-api HTTP, webhook signer, sink and receiver
	FUZZTIME=$${FUZZTIME:-10m} MODULES="$${MODULES:-modules/envelope modules/producer modules/receiver services/ingest-api services/delivery-worker tools}" scripts/test.sh

lint: ## go vet and gofmt over every module
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	@for d in $$(go list -m -f '{{.Dir}}'); do (cd $$d && go vet ./...) || exit 1; done

tidy: ## go mod tidy in every module
	@for d in $$(go list -m -f '{{.Dir}}'); do (cd $$d && go mod tidy) || exit 1; done

build: ## build every binary into bin/
	@mkdir -p bin
	for s in ingest-api delivery-worker retention-janitor; do (cd services/$$s && go build -o ../../bin/$$s .) || exit 1; done
	cd tools && go build -o ../bin/ ./envctl ./loadgen-ingest ./loadgen-delivery ./webhook-sink

bench-envelope: ## envelope parse/canonicalize/verify benchmarks
	cd modules/envelope && go test -run '^$$' -bench . -benchmem -count 5

bench-store: ## store ingest benchmarks beside pgbench, same database, same run
	modules/store/bench/run.sh

bench-ingest: ## ingest-api over HTTP beside pgbench, same database, same run
	scripts/bench-ingest.sh

bench-janitor: ## janitor delete throughput and its effect on concurrent ingest p99
	scripts/bench-janitor.sh

bench-outbox: ## POST /v1/outbox: one busy producer vs sixteen, batch vs single (alternating rounds)
	scripts/bench-outbox.sh

bench-growth: ## ingest throughput and p99, 16 producers, on an empty database vs 1 M and 5 M retained identities (alternating rounds)
	scripts/bench-growth.sh

bench-delivery: ## delivery-worker over HTTP beside a raw SQL claim-and-settle loop
	scripts/bench-delivery.sh

soak: ## the whole stack at a steady rate for SOAK_DURATION (default 20m), janitor every minute; figures and a flatness verdict
	scripts/soak.sh

chaos: ## fault injection: SIGKILL, PostgreSQL restarts, a TCP proxy and a faulty sink under load (CHAOS_DURATION of faults, default 8m)
	cd tools && CHAOS_DURATION=$${CHAOS_DURATION:-8m} go test -run '^TestChaos$$' -count=1 -v -timeout 90m ./internal/chaos
