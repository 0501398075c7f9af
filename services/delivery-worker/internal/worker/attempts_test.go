package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store"
)

// syncBuffer is a log sink the worker's goroutines write while the test
// reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(msg string) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(l), &m) == nil && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// Every settled attempt is in the message's history with the worker's
// timing and the answer's status, and in one log line holding the ids, the
// attempt, status, code and duration and nothing else.
func TestSettledAttemptsAreRecordedAndLogged(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(r *http.Request, n int) int {
		if n == 1 {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	})
	ep := e.endpoint("t1", "orders", rc.srv.URL+"/hook?token=query-secret", "ep")
	_, ids := e.enqueue("t1", "orders", 12)
	// Nothing listens on port 1: no answer, so no status.
	e.endpoint("t1", "closed", "http://127.0.0.1:1/hook", "ep")
	_, closed := e.enqueue("t1", "closed", 1)
	var logs syncBuffer
	w, _ := newWorker(t, e.dsn, opts{log: &logs})

	before := time.Now()
	cycleUntil(t, w, func() bool {
		return e.status("t1", ids[0]).Status == store.StatusDelivered && e.status("t1", closed[0]).Status == store.StatusDead
	})
	after := time.Now()

	as, err := e.st.Outbox().OutboxAttempts(context.Background(), "t1", ids[0])
	if err != nil || len(as) != 2 {
		t.Fatalf("attempts %+v, %v", as, err)
	}
	for i, want := range []store.Attempt{
		{Attempt: 1, HTTPStatus: 503, ErrorCode: store.CodeHTTP5xx, Result: store.AttemptRetry},
		{Attempt: 2, HTTPStatus: 204, Result: store.AttemptDelivered},
	} {
		got := as[i]
		if got.StartedAt.Before(before.Truncate(time.Microsecond)) || got.StartedAt.After(after) ||
			got.Duration < 0 || got.Duration > after.Sub(before) {
			t.Errorf("attempt %d timing: %+v (test ran %v..%v)", i+1, got, before, after)
		}
		got.StartedAt, got.Duration = time.Time{}, 0
		if got != want {
			t.Errorf("attempt %d: %+v, want %+v", i+1, got, want)
		}
	}
	ca, err := e.st.Outbox().OutboxAttempts(context.Background(), "t1", closed[0])
	if err != nil || len(ca) != 1 || ca[0].HTTPStatus != 0 || ca[0].ErrorCode != store.CodeConnectFailed || ca[0].Result != store.AttemptDead {
		t.Fatalf("unanswered attempt %+v, %v", ca, err)
	}

	lines := logs.lines("attempt settled")
	if len(lines) != 3 {
		t.Fatalf("%d attempt lines, want 3 (one per settled attempt):\n%s", len(lines), logs.b.String())
	}
	wantKeys := map[string][]string{
		"1": {"attempt", "duration_ms", "endpoint_id", "error_code", "http_status", "level", "message_id", "msg", "result", "time"},
		"2": {"attempt", "duration_ms", "endpoint_id", "http_status", "level", "message_id", "msg", "result", "time"},
	}
	var seen []string
	for _, l := range lines {
		if l["message_id"] != ids[0] {
			if l["message_id"] != closed[0] || l["result"] != "dead" || l["error_code"] != store.CodeConnectFailed || l["http_status"] != nil {
				t.Errorf("unanswered attempt line %v", l)
			}
			continue
		}
		keys := make([]string, 0, len(l))
		for k := range l {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		n := "1"
		if l["attempt"] == float64(2) {
			n = "2"
		}
		seen = append(seen, n)
		if !slices.Equal(keys, wantKeys[n]) {
			t.Errorf("attempt %s line has %v, want exactly %v", n, keys, wantKeys[n])
		}
		if l["endpoint_id"] != ep {
			t.Errorf("attempt %s line %v", n, l)
		}
		if n == "1" && (l["http_status"] != float64(503) || l["error_code"] != store.CodeHTTP5xx || l["result"] != "retry") {
			t.Errorf("first attempt line %v", l)
		}
		if n == "2" && (l["http_status"] != float64(204) || l["result"] != "delivered") {
			t.Errorf("second attempt line %v", l)
		}
	}
	if sort.Strings(seen); !slices.Equal(seen, []string{"1", "2"}) {
		t.Errorf("attempt lines for %v, want 1 and 2", seen)
	}
	if strings.Contains(logs.b.String(), "query-secret") {
		t.Error("a log line holds the endpoint URL's query")
	}
}
