// Package chaos is the fault-injection proving ground of issue 7: it drives ingest-api and
// delivery-worker (several replicas of each, built from this repository) under steady load while it
// injects faults one family at a time and then mixed, and afterwards holds the database to what the
// clients were told and what the webhook sink received (Check). The devices send through
// modules/producer and see every answer through producer.WithObserver.
//
// Faults: SIGKILL and restart of a replica; a PostgreSQL restart in fast and immediate mode and
// pg_terminate_backend of random sessions; an in-process Toxiproxy between each binary and
// PostgreSQL adding latency, stalling and resetting connections; a webhook sink that stalls, resets,
// answers slowly, answers 500 or 429 with Retry-After, or goes away and comes back.
//
// Everything runs on loopback against a throwaway PostgreSQL cluster of its own (initdb into a
// temporary directory, a free port, run as a non-root user when the test runs as root): the shared
// server on 5432 is never touched, let alone restarted. Every loop is bounded in time and count, and
// everything stops by itself. The figures are in docs/reliability.md ("Fault injection").
//
// Run: go test ./internal/chaos (the default, about a minute and a half, CHAOS_DURATION=45s of faults);
// CHAOS_DURATION=8m make chaos for the long form.
package chaos
