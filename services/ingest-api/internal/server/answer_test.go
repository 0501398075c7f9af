package server

import (
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/producer/wire"
	"github.com/envelopeworker/envelopeworker/modules/store"
)

// The store writes the replay's audit row in SQL and so keeps its own
// spelling of the outcome; the access log and metrics use the wire one.
func TestReplayOutcomeIsTheStoreAuditOutcome(t *testing.T) {
	if store.OutcomeReplayed != string(wire.OutcomeReplayed) {
		t.Fatalf("store %q, wire %q", store.OutcomeReplayed, wire.OutcomeReplayed)
	}
}

// Every code the handlers refuse with has a status in the one table: an
// unknown code would answer 500.
func TestEveryServerReasonHasAStatus(t *testing.T) {
	for _, r := range []wire.Reason{
		reasonUnauthenticated, reasonRateLimited, reasonForbidden, reasonRouteMismatch, reasonIdempotencyKeyMismatch,
		reasonUnknownKey, reasonKeyRetired, reasonKeyRevoked, reasonBodyTooLarge, reasonInvalidEnvelope, reasonUnavailable,
		reasonInvalidRequest, reasonInvalidPage, reasonNotFound, reasonMethodNotAllowed, reasonIdempotencyConflict,
		reasonNoSigningKey, reasonNoEndpoint, reasonNotDead, reasonPayloadExpired,
	} {
		if s := r.Status(); s < 400 || s > 503 || s == 500 {
			t.Errorf("%s answers %d", r, s)
		}
	}
}
