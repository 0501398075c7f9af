package receiver

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

type keyServer struct {
	fetches atomic.Int32
	body    atomic.Value // string
	status  atomic.Int32
}

func newKeyServer(t *testing.T, body string) (*keyServer, *httptest.Server) {
	ks := &keyServer{}
	ks.body.Store(body)
	ks.status.Store(200)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ks.fetches.Add(1)
		if r.URL.Path != OutboundKeysPath || r.Header.Get("Authorization") != "Bearer tok" {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.WriteHeader(int(ks.status.Load()))
		_, _ = w.Write([]byte(ks.body.Load().(string)))
	}))
	t.Cleanup(srv.Close)
	return ks, srv
}

func TestRemoteKeysRefreshAtMostOnceAMinute(t *testing.T) {
	ks, srv := newKeyServer(t, `{"keys":[{"key_id":"k0","public_key":"`+envPublicText+`","current":true}]}`)
	now := testNow
	rk := NewRemoteKeys(srv.URL+"/", "tok", nil)
	rk.now = func() time.Time { return now }
	ctx := context.Background()

	if _, err := rk.PublicKey(ctx, "k1"); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("unknown after a fresh fetch: %v", err)
	}
	if _, err := rk.PublicKey(ctx, "k0"); err != nil {
		t.Fatalf("cached key: %v", err)
	}
	ks.body.Store(`{"keys":[{"key_id":"k1","public_key":"` + envPublicText + `","current":true},` +
		`{"key_id":"k0","public_key":"` + envPublicText + `","current":false}]}`)
	now = now.Add(RefreshInterval - time.Second)
	if _, err := rk.PublicKey(ctx, "k1"); !errors.Is(err, ErrKeysUnavailable) {
		t.Fatalf("within the minute: %v", err)
	}
	if n := ks.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches within one minute", n)
	}
	now = now.Add(time.Second)
	if _, err := rk.PublicKey(ctx, "k1"); err != nil {
		t.Fatalf("after the minute: %v", err)
	}
	if n := ks.fetches.Load(); n != 2 {
		t.Fatalf("%d fetches", n)
	}

	// A failing API is unavailable (retry), never unknown (give up).
	ks.status.Store(500)
	now = now.Add(RefreshInterval)
	if _, err := rk.PublicKey(ctx, "k9"); !errors.Is(err, ErrKeysUnavailable) {
		t.Fatalf("failing API: %v", err)
	}
	if _, err := rk.PublicKey(ctx, "k0"); err != nil {
		t.Fatalf("a failed refresh dropped the cached keys: %v", err)
	}
}

func TestRemoteKeysRefusesBadAnswers(t *testing.T) {
	for _, body := range []string{
		``, `[]`, `{"keys":null}`, `{"keys":[],"x":1}`, `{"keys":[],"keys":[]}`,
		`{"keys":[{"key_id":"bad id","public_key":"` + envPublicText + `","current":true}]}`,
		`{"keys":[{"key_id":"k1","public_key":"AAAA","current":true}]}`,
		`{"keys":[{"key_id":"k1","public_key":"` + envPublicText + `"},{"key_id":"k1","public_key":"` + envPublicText + `"}]}`,
	} {
		_, srv := newKeyServer(t, body)
		rk := NewRemoteKeys(srv.URL, "tok", nil)
		if err := rk.Refresh(context.Background()); err == nil {
			t.Fatalf("accepted %q", body)
		}
	}
	_, srv := newKeyServer(t, `{"keys":[]}`)
	if err := NewRemoteKeys(srv.URL, "tok", nil).Refresh(context.Background()); err != nil {
		t.Fatalf("empty key list: %v", err)
	}
	if err := NewRemoteKeys(srv.URL, "wrong", nil).Refresh(context.Background()); err == nil {
		t.Fatal("401 accepted")
	}
}

// TestMiddlewareAnswersUnknownKeyByRefreshState: an unknown key id that a
// fresh fetch confirms is 401; one that cannot be fetched yet is 503 with
// Retry-After, so the sender keeps the message.
func TestMiddlewareAnswersUnknownKeyByRefreshState(t *testing.T) {
	_, srv := newKeyServer(t, `{"keys":[]}`)
	rk := NewRemoteKeys(srv.URL, "tok", nil)
	rk.now = func() time.Time { return testNow }
	v, err := New(Config{Secrets: []string{hmacSecret}, Keys: rk, Now: func() time.Time { return testNow }})
	if err != nil {
		t.Fatal(err)
	}
	body := signedEnvelope(t, 1)
	ts := strconv.FormatInt(testNow.Unix(), 10)
	h := v.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { t.Fatal("next ran") }))
	for i, want := range []Code{CodeUnknownKey, CodeKeysUnavailable} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, delivery("msg_1", testNow, body, v1Entry(hmacKey, "msg_1", ts, body)))
		if reasonOf(t, w) != string(want) || w.Code != want.Status() {
			t.Fatalf("delivery %d: %d %s", i, w.Code, w.Body)
		}
		if want == CodeKeysUnavailable && w.Header().Get("Retry-After") == "" {
			t.Fatal("503 without Retry-After")
		}
	}
}

// TestRemoteKeysOneFetchForManyDeliveries: deliveries arriving together
// under a new key id share one fetch.
func TestRemoteKeysOneFetchForManyDeliveries(t *testing.T) {
	ks, srv := newKeyServer(t, `{"keys":[{"key_id":"k1","public_key":"`+envPublicText+`","current":true}]}`)
	rk := NewRemoteKeys(srv.URL, "tok", nil)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for i := 0; i < 32; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := rk.PublicKey(context.Background(), "k1"); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := ks.fetches.Load(); n != 1 {
		t.Fatalf("%d fetches for one new key id", n)
	}
}
