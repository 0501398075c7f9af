// Package e2e runs the tools against the real ingest-api binary: it builds services/ingest-api from
// this repository, starts it on loopback against a fresh test database, and drives it with envctl
// (in-process) and the load generator. It has only tests; it exists because the tools module may not
// import services, yet `envctl send` and loadgen-ingest are only right if the real service agrees.
package e2e
