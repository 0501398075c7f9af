package receiver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestVerifyAcceptsEachScheme(t *testing.T) {
	v := newTestVerifier(t)
	body := signedEnvelope(t, 1)
	ts := strconv.FormatInt(testNow.Unix(), 10)
	for name, sig := range map[string]string{
		"v1":                  v1Entry(hmacKey, "msg_1", ts, body),
		"v1a":                 v1aEntry(whPriv, "msg_1", ts, body),
		"old and new v1":      v1Entry(bytes.Repeat([]byte{8}, 32), "msg_1", ts, body) + " " + v1Entry(hmacKey, "msg_1", ts, body),
		"unknown version too": "v9,AAAA " + v1Entry(hmacKey, "msg_1", ts, body),
	} {
		t.Run(name, func(t *testing.T) {
			d, err := v.Verify(delivery("msg_1", testNow, body, sig))
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			if d.WebhookID != "msg_1" || !d.Timestamp.Equal(testNow) || d.Envelope.Sequence != 1 ||
				string(d.Envelope.Payload) != `{"n":1}` {
				t.Fatalf("delivery %+v", d)
			}
		})
	}
}

// TestSharedVector checks the Standard Webhooks known-answer case
// (testdata/webhooks.json, a copy of the project's shared vectors): its
// signature verifies the headers; its body is not an envelope, so the
// answer is invalid_envelope, which comes after the signature check.
func TestSharedVector(t *testing.T) {
	data, err := os.ReadFile("testdata/webhooks.json")
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Vectors []struct {
			Secret    string `json:"secret"`
			ID        string `json:"webhook_id"`
			Timestamp string `json:"webhook_timestamp"`
			Body      string `json:"body"`
			Signature string `json:"webhook_signature"`
		}
	}
	if err := json.Unmarshal(data, &file); err != nil || len(file.Vectors) == 0 {
		t.Fatalf("vectors: %v", err)
	}
	for _, vec := range file.Vectors {
		s, err := parseSecret(vec.Secret)
		if err != nil {
			t.Fatal(err)
		}
		h, rerr := parseHeaders(vec.ID, vec.Timestamp, vec.Signature)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if !h.verify([]secret{s}, []byte(vec.Body)) {
			t.Fatal("known-answer signature does not verify")
		}
		if h.verify([]secret{s}, []byte(vec.Body+" ")) {
			t.Fatal("changed body verifies")
		}
		ts, _ := strconv.ParseInt(vec.Timestamp, 10, 64)
		keys, _ := StaticKeys(map[string]string{"k1": envPublicText})
		v, err := New(Config{Secrets: []string{vec.Secret}, Keys: keys, Now: func() time.Time { return time.Unix(ts, 0) }})
		if err != nil {
			t.Fatal(err)
		}
		w := httptest.NewRecorder()
		v.Middleware(http.NotFoundHandler()).ServeHTTP(w, delivery(vec.ID, time.Unix(ts, 0), []byte(vec.Body), vec.Signature))
		if got := reasonOf(t, w); got != string(CodeInvalidEnvelope) || w.Code != 400 {
			t.Fatalf("answer %d %s", w.Code, w.Body)
		}
	}
}

func TestVerifyRefuses(t *testing.T) {
	v := newTestVerifier(t)
	body := signedEnvelope(t, 1)
	ts := strconv.FormatInt(testNow.Unix(), 10)
	good := v1Entry(hmacKey, "msg_1", ts, body)
	other := signedEnvelope(t, 2)

	tampered := bytes.Replace(body, []byte(`"n":1`), []byte(`"n":2`), 1)
	otherKey := func() []byte {
		b := bytes.Replace(body, []byte(`"key_id":"k1"`), []byte(`"key_id":"k2"`), 1)
		return b
	}()
	otherTenant := bytes.Replace(body, []byte(`"tenant_id":"t1"`), []byte(`"tenant_id":"t2"`), 1)
	badMeta := bytes.Replace(body, []byte(`"kind":"proposal"`), []byte(`"kind":"Bad Kind"`), 1)
	big := bytes.Repeat([]byte(" "), MaxBodyBytes+1)

	type tc struct {
		name string
		req  func() *http.Request
		code Code
	}
	resign := func(b []byte) func() *http.Request {
		return func() *http.Request { return delivery("msg_1", testNow, b, v1Entry(hmacKey, "msg_1", ts, b)) }
	}
	cases := []tc{
		{"GET", func() *http.Request { r := delivery("msg_1", testNow, body, good); r.Method = http.MethodGet; return r }, CodeMethodNotAllowed},
		{"no id", func() *http.Request { r := delivery("msg_1", testNow, body, good); r.Header.Del(HeaderID); return r }, CodeMissingHeader},
		{"no timestamp", func() *http.Request {
			r := delivery("msg_1", testNow, body, good)
			r.Header.Del(HeaderTimestamp)
			return r
		}, CodeMissingHeader},
		{"no signature", func() *http.Request { return delivery("msg_1", testNow, body, "") }, CodeMissingHeader},
		{"id with space", func() *http.Request { return delivery("msg 1", testNow, body, good) }, CodeMalformedHeader},
		{"long id", func() *http.Request { return delivery(strings.Repeat("a", 257), testNow, body, good) }, CodeMalformedHeader},
		{"timestamp not digits", func() *http.Request {
			r := delivery("msg_1", testNow, body, good)
			r.Header.Set(HeaderTimestamp, "+"+ts)
			return r
		}, CodeMalformedHeader},
		{"timestamp overflow", func() *http.Request {
			r := delivery("msg_1", testNow, body, good)
			r.Header.Set(HeaderTimestamp, "9999999999999999999")
			return r
		}, CodeMalformedHeader},
		{"entry without comma", func() *http.Request { return delivery("msg_1", testNow, body, "v1") }, CodeMalformedHeader},
		{"v1 not base64", func() *http.Request { return delivery("msg_1", testNow, body, "v1,@@@") }, CodeMalformedHeader},
		{"v1 short", func() *http.Request { return delivery("msg_1", testNow, body, "v1,AAAA") }, CodeMalformedHeader},
		{"too many entries", func() *http.Request {
			return delivery("msg_1", testNow, body, strings.TrimSpace(strings.Repeat(good+" ", 17)))
		}, CodeMalformedHeader},
		{"v1 with stray bits (a second spelling of the signature)", func() *http.Request {
			// The last base64 character before "=" carries 2 bits past the
			// 32 bytes; a decoder that ignores them would accept 3 other
			// texts for one signature.
			b := []byte(good)
			i := len(b) - 2
			b[i] = base64Next(b[i])
			return delivery("msg_1", testNow, body, string(b))
		}, CodeMalformedHeader},
		{"only unknown versions", func() *http.Request { return delivery("msg_1", testNow, body, "v2,AAAA") }, CodeBadSignature},
		{"stale", func() *http.Request {
			old := testNow.Add(-DefaultTolerance - time.Second)
			return delivery("msg_1", old, body, v1Entry(hmacKey, "msg_1", strconv.FormatInt(old.Unix(), 10), body))
		}, CodeStaleTimestamp},
		{"future", func() *http.Request {
			f := testNow.Add(DefaultTolerance + time.Second)
			return delivery("msg_1", f, body, v1Entry(hmacKey, "msg_1", strconv.FormatInt(f.Unix(), 10), body))
		}, CodeStaleTimestamp},
		{"wrong secret", func() *http.Request {
			return delivery("msg_1", testNow, body, v1Entry(bytes.Repeat([]byte{1}, 32), "msg_1", ts, body))
		}, CodeBadSignature},
		{"signature of another id", func() *http.Request { return delivery("msg_2", testNow, body, good) }, CodeBadSignature},
		{"signature of another body", func() *http.Request { return delivery("msg_1", testNow, other, good) }, CodeBadSignature},
		{"too large", func() *http.Request { return delivery("msg_1", testNow, big, v1Entry(hmacKey, "msg_1", ts, big)) }, CodeBodyTooLarge},
		{"too large, no length", func() *http.Request {
			r := delivery("msg_1", testNow, big, v1Entry(hmacKey, "msg_1", ts, big))
			r.ContentLength = -1
			return r
		}, CodeBodyTooLarge},
		{"lying length", func() *http.Request {
			r := delivery("msg_1", testNow, big, v1Entry(hmacKey, "msg_1", ts, big))
			r.ContentLength = 10
			return r
		}, CodeBodyTooLarge},
		{"not an envelope", resign([]byte(`{"a":1}`)), CodeInvalidEnvelope},
		{"duplicate member", resign(append([]byte(`{"a":1,"a":2`), '}')), CodeInvalidEnvelope},
		{"bad metadata", resign(badMeta), CodeInvalidEnvelope},
		{"other tenant", resign(otherTenant), CodeWrongTenant},
		{"unknown key", resign(otherKey), CodeUnknownKey},
		{"tampered envelope", resign(tampered), CodeBadEnvelopeSignature},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			called := false
			w := httptest.NewRecorder()
			v.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called = true })).ServeHTTP(w, c.req())
			if called {
				t.Fatal("next ran for a refused delivery")
			}
			if got := reasonOf(t, w); got != string(c.code) || w.Code != c.code.Status() {
				t.Fatalf("answer %d %q, want %d %s", w.Code, w.Body, c.code.Status(), c.code)
			}
		})
	}
}

// TestBodyGrowsWithItsBytes sends a body that declares 1 MiB and holds 10
// bytes: the reader must not have reserved the declared size.
func TestBodyGrowsWithItsBytes(t *testing.T) {
	v := newTestVerifier(t)
	r := delivery("msg_1", testNow, []byte("0123456789"), "v1,"+base64.StdEncoding.EncodeToString(make([]byte, 32)))
	r.ContentLength = MaxBodyBytes
	b, err := v.readBody(r)
	if err != nil || len(b) != 10 {
		t.Fatalf("%q %v", b, err)
	}
	if cap(b) > 4096 {
		t.Fatalf("buffer of %d bytes for a 10-byte body", cap(b))
	}
}

func TestNewRefusesBadSecrets(t *testing.T) {
	keys, _ := StaticKeys(map[string]string{"k1": envPublicText})
	for _, s := range []string{"", "whsec_", "whsec_AAAA", "whsec_!!!!", "whpk_AAAA", "whsk_" + strings.Repeat("A", 43), "secret"} {
		_, err := New(Config{Secrets: []string{s}, Keys: keys})
		if !errors.Is(err, ErrSecret) {
			t.Fatalf("%q: %v", s, err)
		}
		if len(s) > 6 && strings.Contains(err.Error(), s[6:]) {
			t.Fatalf("error repeats the secret: %v", err)
		}
	}
	if _, err := New(Config{Secrets: []string{hmacSecret}}); err == nil {
		t.Fatal("no Keys accepted")
	}
	if _, err := StaticKeys(map[string]string{"k1": "AAAA"}); !errors.Is(err, ErrSecret) {
		t.Fatalf("short public key: %v", err)
	}
}

func TestHandlerRunsEffectOnce(t *testing.T) {
	v := newTestVerifier(t)
	rc := &memReceipts{}
	effects := 0
	fail := true
	h := Handler[*int](v, rc, func(_ context.Context, _ *int, d *Delivery) error {
		if d.Envelope == nil {
			t.Fatal("effect without envelope")
		}
		if fail {
			fail = false
			return errors.New("database down")
		}
		effects++
		return nil
	})
	body := signedEnvelope(t, 1)
	ts := strconv.FormatInt(testNow.Unix(), 10)
	send := func() *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, delivery("msg_1", testNow, body, v1Entry(hmacKey, "msg_1", ts, body)))
		return w
	}
	if w := send(); w.Code != 500 || reasonOf(t, w) != string(CodeEffectFailed) || strings.Contains(w.Body.String(), "database") {
		t.Fatalf("failing effect: %d %s", w.Code, w.Body)
	}
	for i := 0; i < 3; i++ {
		if w := send(); w.Code != http.StatusNoContent {
			t.Fatalf("delivery %d: %d %s", i, w.Code, w.Body)
		}
	}
	if effects != 1 {
		t.Fatalf("%d effects, want 1", effects)
	}
}

// base64Next is the next character of the standard alphabet.
func base64Next(c byte) byte {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	i := strings.IndexByte(alphabet, c)
	return alphabet[(i+1)%len(alphabet)]
}
