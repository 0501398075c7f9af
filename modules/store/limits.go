package store

import "time"

// The limits and defaults of the store's calls, in one place: each limit is
// checked by the call it names (ErrInvalid beyond it), and the services and
// envctl quote them rather than repeat them.
const (
	// DefaultMaxAhead is the contract's default sequence_too_far_ahead bound.
	DefaultMaxAhead = 1024

	// DefaultOutboxPayloadRetention is OUTBOX_PAYLOAD_RETENTION's default (§8.9).
	DefaultOutboxPayloadRetention = 2160 * time.Hour

	// MaxAdminPage bounds one page of ListEndpoints, ListKeys and ListCredentials.
	MaxAdminPage = 1000

	// MaxAttemptHistory is how many of a message's attempts OutboxAttempts
	// returns: the latest ones.
	MaxAttemptHistory = 100

	// MaxAuditLimit bounds one ListAudit page.
	MaxAuditLimit = 1000

	// MaxBackfillBatch bounds one BackfillBodies transaction.
	MaxBackfillBatch = 1000

	// MaxBatch bounds IngestBatch. The HTTP batch route allows 100 envelopes; the
	// margin leaves room for group commit of several requests.
	MaxBatch = 1000

	// MaxDeleteBatch bounds one retention pass (contract §5).
	MaxDeleteBatch = 1000

	// MaxEndpointURL bounds an endpoint URL in bytes.
	MaxEndpointURL = 2048

	// MaxEnqueueBatch bounds the items of one EnqueueBatch (and so of one
	// POST /v1/outbox/batch, contract §8.5).
	MaxEnqueueBatch = 100

	// MaxReadLimit bounds ReadStream (the HTTP route allows 100).
	MaxReadLimit = 1000

	// MaxSettleBatch bounds one SettleBatch.
	MaxSettleBatch = 1000
)
