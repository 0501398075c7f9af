// Package e2e runs the tools against the real binaries: it builds services/ingest-api (and, where a
// test needs it, services/delivery-worker) from this repository, starts them on loopback against a
// fresh test database, and drives them with envctl (in-process) and the load generator. It has only
// tests; it exists because the tools module may not import services, yet `envctl send` and
// loadgen-ingest are only right if the real service agrees. upgrade_test.go runs both binaries on a
// schema one version older and one newer than they were built for (contract §8.1). receiver_test.go
// delivers outbox messages to testreceiver, a consumer built on modules/receiver that SIGKILLs itself
// between committing an effect and answering, and checks that every effect happens exactly once.
// chain_test.go runs the whole chain at once — a producer child killed between send and answer, a relay
// from the ingested stream into the outbox, the worker, that receiver killed between effect and answer —
// and checks every effect once and both sequences contiguous.
package e2e
