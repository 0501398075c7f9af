// Package producer is the device side of controlplane/v1: it turns events
// into signed envelopes, numbers them, saves each one (SequenceStore)
// before sending it to ingest-api, and keeps it until the service answers.
// After a crash, Resume re-sends the unanswered envelopes byte for byte and
// continues above the service's cursor. Retries happen only where the
// contract says they are safe (429 honouring Retry-After, 5xx, timeouts,
// connection errors), within an overall deadline; a refusal is returned at
// once as a typed Result. The README lists the decisions where the contract
// is silent. Package wire holds the inbound routes' wire types.
package producer
