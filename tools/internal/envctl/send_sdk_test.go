package envctl

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

func unsequenced(seq int, producerID string) string {
	return strings.Replace(draftJSON(seq, producerID), `,"sequence":`+itoa(seq), "", 1)
}

func TestSendWithStateFile(t *testing.T) {
	f := newSendFixture(t)
	state := filepath.Join(f.dir, "state.json")
	base := []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--state-file", state}
	// The fixed answer says cursor 1 to the stream read too, so the producer continues at 2.
	r := f.send(t, append(base, "--file", f.file(t, "d.json", unsequenced(7, "d1")))...)
	r.expect(t, ExitOK, "")
	var line sendResult
	if err := json.Unmarshal([]byte(r.stdout), &line); err != nil || line.EventID != "e-7" || line.Sequence != 2 || line.Outcome != "accepted" || line.Status != 200 {
		t.Fatalf("stdout %q (%v)", r.stdout, err)
	}
	f.noSecrets(t, r)
	e, err := envelope.Parse(f.rc.body)
	if err != nil || e.Verify(f.pub) != nil || e.Sequence != 2 || e.KeyID != "key-1" {
		t.Fatalf("sent %s (%v)", f.rc.body, err)
	}
	if _, err := os.Stat(state); err != nil {
		t.Fatalf("no state file: %v", err)
	}

	batch := f.file(t, "b.json", "["+unsequenced(8, "d1")+","+unsequenced(9, "d1")+"]")
	r = f.send(t, append(base, "--batch", "--file", batch)...)
	// The fixture's single-route answer to the batch route is not a batch answer: the producer
	// keeps both envelopes for the next run and says so.
	if r.code != ExitFailure || !strings.Contains(r.stderr, "kept in the state file") {
		t.Fatalf("exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	f.noSecrets(t, r)
}

func TestSendWithStateFileRefusesWhatItCannotDo(t *testing.T) {
	f := newSendFixture(t)
	state := filepath.Join(f.dir, "state.json")
	base := []string{"--url", f.srv.URL, "--token-file", f.tokenFile, "--seed-file", f.seedFile, "--state-file", state}
	cases := map[string][]string{
		"a sequence in the draft": {"--file", f.file(t, "s.json", draftJSON(1, "d1"))},
		"two streams":             {"--batch", "--file", f.file(t, "two.json", "["+unsequenced(1, "d1")+","+unsequenced(2, "d2")+"]")},
		"an idempotency header":   {"--idempotency-header", "=", "--file", f.file(t, "h.json", unsequenced(1, "d1"))},
	}
	for name, args := range cases {
		r := f.send(t, append(base, args...)...)
		if r.code != ExitUsage {
			t.Errorf("%s: exit %d, stderr %q", name, r.code, r.stderr)
		}
	}
	if f.rc.requests != 0 {
		t.Errorf("%d requests were sent", f.rc.requests)
	}
}
