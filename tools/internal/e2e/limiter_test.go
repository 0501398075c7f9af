package e2e

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
)

// startLimitedIngest runs the real ingest-api with the given limiter
// settings and returns its base URL.
func startLimitedIngest(t *testing.T, dsn string, env ...string) (string, *service) {
	t.Helper()
	addr := freeAddr(t)
	env = append([]string{"DATABASE_URL=" + dsn, "INGEST_ADDR=" + addr, "METRICS_ADDR=" + freeAddr(t)}, env...)
	s := startService(t, "ingest-api", env, "http://"+addr+"/readyz")
	return "http://" + addr, s
}

// peerRead is an unauthenticated stream read from loopback: 401 while the
// peer limiter lets it through, 429 once it does not.
func peerRead(t *testing.T, base string, xff ...string) httpAnswer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/v1/streams/proj-1/device-1", nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range xff {
		req.Header.Add("X-Forwarded-For", v)
	}
	return roundTrip(t, req)
}

func wantStatus(t *testing.T, a httpAnswer, status int, what string) {
	t.Helper()
	if a.status != status {
		t.Fatalf("%s: %d %s, want %d", what, a.status, a.body, status)
	}
}

// TestTrustedProxiesInTheBinary: with TRUSTED_PROXIES=127.0.0.1/32 two
// clients named by X-Forwarded-For from the loopback peer get a bucket each;
// without it the header is ignored and they share loopback's.
func TestTrustedProxiesInTheBinary(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	limits := []string{"PEER_LIMIT_TOKENS=1", "PEER_LIMIT_INTERVAL=1h"}

	base, s := startLimitedIngest(t, dsn, append(limits, "TRUSTED_PROXIES=127.0.0.1/32")...)
	wantStatus(t, peerRead(t, base, "203.0.113.1"), 401, "client 1 through the trusted proxy")
	limited := peerRead(t, base, "203.0.113.1")
	wantStatus(t, limited, 429, "client 1 again")
	// The next token is an hour after the first request, less the time
	// between the two (a slow machine may take seconds).
	if got, err := strconv.Atoi(limited.header.Get("Retry-After")); err != nil || got < 3590 || got > 3600 {
		t.Fatalf("Retry-After %q, want 3590-3600 (1 an hour)", limited.header.Get("Retry-After"))
	}
	wantStatus(t, peerRead(t, base, "203.0.113.2"), 401, "client 2 through the trusted proxy")
	wantStatus(t, peerRead(t, base, "198.51.100.1", "203.0.113.2"), 429, "client 2 behind a client-written entry")
	wantStatus(t, peerRead(t, base), 401, "the proxy itself")
	wantStatus(t, peerRead(t, base, "not-an-address"), 429, "a malformed entry counts as the proxy")
	s.stop()

	base, _ = startLimitedIngest(t, dsn, limits...)
	wantStatus(t, peerRead(t, base, "203.0.113.1"), 401, "first request, no trusted proxies")
	wantStatus(t, peerRead(t, base, "203.0.113.2"), 429, "another X-Forwarded-For from an untrusted peer")
}

// TestLargePoliciesStart: policies above the old √interval ceiling (31,622 a
// second) start and serve; they used to stop the binary.
func TestLargePoliciesStart(t *testing.T) {
	dsn := storetest.NewDatabase(t)
	for _, tokens := range []string{"100000", "1000000"} {
		base, s := startLimitedIngest(t, dsn, "PEER_LIMIT_TOKENS="+tokens, "PEER_LIMIT_INTERVAL=1s",
			"SYNC_LIMIT_TOKENS="+tokens, "OUTBOX_LIMIT_TOKENS="+tokens)
		for range 50 {
			wantStatus(t, peerRead(t, base), 401, tokens+" a second")
		}
		s.stop()
	}
}

// TestBadTrustedProxiesStopTheBinary: an invalid CIDR is a start-up error
// that names the setting and the entry.
func TestBadTrustedProxiesStopTheBinary(t *testing.T) {
	bin := buildService(t, "ingest-api")
	// A binary that accepted the list would go on to the database and wait.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin)
	cmd.Env = append(os.Environ(), "DATABASE_URL=postgres://nobody@127.0.0.1:1/none", "TRUSTED_PROXIES=10.0.0.0/8,10.1.2.3")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("exit: %v, want status 1", err)
	}
	if want := `TRUSTED_PROXIES: limiter: invalid trusted proxies: "10.1.2.3" is not a CIDR prefix`; !strings.Contains(stderr.String(), want) {
		t.Fatalf("stderr %q does not say %q", stderr.String(), want)
	}
}
