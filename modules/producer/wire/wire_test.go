package wire

import (
	"encoding/json"
	"testing"
)

// The contract's §2 table, written out again so that a change to Status
// has to be a change to this copy of the contract too.
var contractStatus = map[Reason]int{
	"":                 200,
	"invalid_envelope": 400, "invalid_metadata": 400, "unsupported_schema": 400, "idempotency_key_mismatch": 400,
	"issued_in_future": 400, "expired": 400, "invalid_request": 400, "invalid_page": 400,
	"unauthenticated": 401,
	"route_mismatch":  403, "unknown_key": 403, "key_retired": 403, "key_revoked": 403, "bad_signature": 403, "forbidden": 403,
	"event_conflict": 409, "sequence_conflict": 409, "below_replay_floor": 409, "sequence_too_far_ahead": 409,
	"idempotency_conflict": 422, "no_signing_key": 422, "no_endpoint": 422,
	"not_dead": 409, "payload_expired": 409,
	"body_too_large": 413,
	"rate_limited":   429,
	"unavailable":    503,
	"not_found":      404, "method_not_allowed": 405,
}

func TestStatusIsTheContractTable(t *testing.T) {
	for r, want := range contractStatus {
		if got := r.Status(); got != want {
			t.Errorf("%q: %d, want %d", r, got, want)
		}
	}
	for _, r := range []Reason{"made_up", "Invalid_Envelope", "invalid_envelope ", "replayed", "accepted"} {
		if got := r.Status(); got != 500 {
			t.Errorf("%q is not a reason: %d, want 500", r, got)
		}
	}
}

func TestAnswerEncodesAsTheContractSays(t *testing.T) {
	zero := int64(0)
	for _, c := range []struct {
		a    Answer
		want string
	}{
		{Answer{Outcome: OutcomeAccepted, EventIdentity: "ab", Cursor: &zero, CorrelationID: "c"},
			`{"outcome":"accepted","event_identity":"ab","cursor":0,"correlation_id":"c"}`},
		{Answer{Outcome: OutcomeRefused, Reason: ReasonExpired, CorrelationID: "c", Detail: "issued_at: older than the replay window"},
			`{"outcome":"refused","reason":"expired","correlation_id":"c","detail":"issued_at: older than the replay window"}`},
	} {
		b, err := json.Marshal(c.a)
		if err != nil || string(b) != c.want {
			t.Errorf("%s (%v), want %s", b, err, c.want)
		}
	}
	b, _ := json.Marshal(BatchAnswer{Results: []BatchResult{{Answer: Answer{Outcome: OutcomeDuplicate, Cursor: &zero}, Status: 200}}})
	if want := `{"results":[{"outcome":"duplicate","cursor":0,"correlation_id":"","status":200}]}`; string(b) != want {
		t.Errorf("%s, want %s", b, want)
	}
	if got := StreamPath("p 1", "d/2"); got != "/v1/streams/p%201/d%2F2" {
		t.Errorf("StreamPath escapes to %s", got)
	}
}

func TestOutboxTypesReadAndWriteTheContractsMembers(t *testing.T) {
	var ba EnqueueBatchAnswer
	raw := `{"results":[{"envelope":{"a":1},"message_ids":["m1"],"status":201},` +
		`{"envelope":null,"payload_expired":true,"message_ids":["m2"],"status":200},` +
		`{"outcome":"refused","reason":"no_endpoint","correlation_id":"c","status":422}]}`
	if err := json.Unmarshal([]byte(raw), &ba); err != nil || len(ba.Results) != 3 {
		t.Fatalf("%+v, %v", ba, err)
	}
	if r := ba.Results[0]; string(r.Envelope) != `{"a":1}` || r.MessageIDs[0] != "m1" || r.Status != 201 || r.Outcome != "" {
		t.Errorf("created item read as %+v", r)
	}
	if r := ba.Results[1]; !r.PayloadExpired || string(r.Envelope) != "null" || r.MessageIDs[0] != "m2" {
		t.Errorf("expired repeat read as %+v", r)
	}
	if r := ba.Results[2]; r.Outcome != OutcomeRefused || r.Reason != ReasonNoEndpoint || r.Status != r.Reason.Status() {
		t.Errorf("refused item read as %+v", r)
	}
	b, _ := json.Marshal(MessageStatus{MessageID: "m", EndpointID: "e", Topic: "t", Status: StatePending})
	want := `{"message_id":"m","endpoint_id":"e","topic":"t","status":"pending","attempts":0,"last_error_code":null,"next_attempt_at":null,"delivered_at":null}`
	if string(b) != want {
		t.Errorf("%s, want %s", b, want)
	}
	b, _ = json.Marshal(Attempts{Attempts: []Attempt{{Attempt: 1, StartedAt: "s", Result: AttemptLeaseExpired}}})
	want = `{"attempts":[{"attempt":1,"started_at":"s","duration_ms":0,"http_status":null,"error_code":null,"result":"lease_expired"}]}`
	if string(b) != want {
		t.Errorf("%s, want %s", b, want)
	}
	if got := ReplayPath("a/b"); got != "/v1/dead-letters/a%2Fb/replay" {
		t.Errorf("ReplayPath escapes to %s", got)
	}
}
