package receiver

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// FuzzParseHeaders: any header values are either refused with a code or
// parsed into exactly what they said, and never panic.
func FuzzParseHeaders(f *testing.F) {
	f.Add("msg_1", "1800000000", "v1,"+string(bytes.Repeat([]byte("A"), 43))+"=")
	f.Fuzz(func(t *testing.T, id, ts, sig string) {
		h, err := parseHeaders(id, ts, sig)
		if err != nil {
			if err.Code.Status() < 400 || err.Code.Status() > 499 {
				t.Fatalf("header refusal %s is not a 4xx", err.Code)
			}
			return
		}
		if h.id != id || h.tsText != ts || strconv.FormatInt(h.timestamp, 10) != trimZeros(ts) {
			t.Fatalf("parsed %+v from %q %q", h, id, ts)
		}
		if len(h.v1)+len(h.v1a) == 0 || len(h.v1)+len(h.v1a) > maxSignatureEntries {
			t.Fatalf("%d entries", len(h.v1)+len(h.v1a))
		}
		for _, b := range h.v1 {
			if len(b) != sha256.Size {
				t.Fatalf("v1 of %d bytes", len(b))
			}
		}
		for _, b := range h.v1a {
			if len(b) != ed25519.SignatureSize {
				t.Fatalf("v1a of %d bytes", len(b))
			}
		}
	})
}

func trimZeros(s string) string {
	for len(s) > 1 && s[0] == '0' {
		s = s[1:]
	}
	return s
}

var allCodes = map[string]Code{}

func init() {
	for _, c := range []Code{CodeMethodNotAllowed, CodeMissingHeader, CodeMalformedHeader, CodeStaleTimestamp,
		CodeBadSignature, CodeBodyTooLarge, CodeInvalidEnvelope, CodeWrongTenant, CodeUnknownKey,
		CodeBadEnvelopeSignature, CodeKeysUnavailable, CodeEffectFailed} {
		allCodes[string(c)] = c
	}
}

// FuzzMiddleware sends arbitrary deliveries through the middleware. flags
// bit 0 signs the headers with the v1 secret, bit 1 with the v1a key (so
// the fuzzer reaches the envelope checks), bit 2 replaces the body with a
// valid envelope before mutating byte pos with x (bit 3). Whatever it
// sends: no panic, every refusal is a known code with its status, and the
// handler runs only for a delivery whose headers and envelope verify.
func FuzzMiddleware(f *testing.F) {
	env := signedEnvelope(f, 1)
	f.Add("msg_1", int64(0), []byte(`{}`), "", uint8(1), uint16(0), byte(0))
	f.Add("msg_1", int64(0), env, "", uint8(1), uint16(0), byte(0))
	f.Add("msg_1", int64(0), env, "", uint8(2), uint16(0), byte(0))
	f.Add("msg_1", int64(0), []byte{}, "", uint8(13), uint16(30), byte('x'))
	f.Add("msg_1", int64(400), []byte(`[]`), "v1,AAAA", uint8(0), uint16(0), byte(0))
	v := newTestVerifier(f)
	f.Fuzz(func(t *testing.T, id string, skew int64, body []byte, sig string, flags uint8, pos uint16, x byte) {
		if flags&4 != 0 {
			body = bytes.Clone(env)
			if flags&8 != 0 && len(body) > 0 {
				body[int(pos)%len(body)] = x
			}
		}
		ts := strconv.FormatInt(testNow.Unix()+skew, 10)
		if flags&1 != 0 {
			sig += " " + v1Entry(hmacKey, id, ts, body)
		}
		if flags&2 != 0 {
			sig += " " + v1aEntry(whPriv, id, ts, body)
		}
		r := httptest.NewRequest(http.MethodPost, "/hook", bytes.NewReader(body))
		r.Header[http.CanonicalHeaderKey(HeaderID)] = []string{id}
		r.Header[http.CanonicalHeaderKey(HeaderTimestamp)] = []string{ts}
		r.Header[http.CanonicalHeaderKey(HeaderSignature)] = []string{sig}
		ran := false
		w := httptest.NewRecorder()
		v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ran = true
			d, ok := FromContext(r.Context())
			if !ok || d.WebhookID != id {
				t.Fatal("handler without its delivery")
			}
			h, herr := parseHeaders(id, ts, sig)
			if herr != nil || !h.verify(v.secrets, body) {
				t.Fatal("handler ran for headers that do not verify")
			}
			if err := d.Envelope.Verify(envPriv.Public().(ed25519.PublicKey)); err != nil {
				t.Fatalf("handler ran for an envelope that does not verify: %v", err)
			}
			w.WriteHeader(http.StatusNoContent)
		})).ServeHTTP(w, r)
		if ran {
			if w.Code != http.StatusNoContent {
				t.Fatalf("handler ran and answer is %d", w.Code)
			}
			return
		}
		code, ok := allCodes[reasonOf(t, w)]
		if !ok || code.Status() != w.Code || w.Code < 400 {
			t.Fatalf("answer %d %q", w.Code, w.Body)
		}
	})
}
