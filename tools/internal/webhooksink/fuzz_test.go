package webhooksink

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// FuzzVerify feeds the sink arbitrary webhook-id, webhook-timestamp,
// webhook-signature and bodies, and checks that it never panics, answers
// only its documented statuses and reasons, and lets nothing past the
// signature check that does not carry the exact v1 signature of
// id.timestamp.body. In sig, "{head}" stands for the true signature's
// base64 text without its last two characters, so the fuzzer can try every
// ending of a real signature (padding, trailing bits, extra characters)
// without forging an HMAC. Then it signs the same (id, timestamp, body) itself:
// that must pass the signature check, and changing one of id, timestamp,
// body or the signature's text must not.
//
// which picks the mutation (id, timestamp, body, signature); pos and x say
// where and how.
func FuzzVerify(f *testing.F) {
	f.Add(vecID, vecTS, []byte(vecBody), vecSig, uint8(3), uint16(5), byte(5))
	f.Add(vecID, vecTS, []byte(vecBody), "v1,{head}E=", uint8(0), uint16(5), byte(5))
	f.Add(vecID, vecTS, []byte(vecBody), vecSig+" v1a,AAAA v1,", uint8(0), uint16(0), byte(1))
	f.Add("", "", []byte{}, "", uint8(1), uint16(0), byte(0))
	f.Add("msg_1", "-1", []byte("{}"), "v1,,v1, v1,===", uint8(2), uint16(1), byte(0x80))
	f.Add("msg_1", "+1614265330", []byte("null"), "v2,abc\tv1,Zm9v", uint8(3), uint16(3), byte(63))

	key := mustSecret(f, vecSecret)
	other := mustSecret(f, "whsec_"+strings.Repeat("QUJD", 8))
	s, err := New(Config{Secrets: [][]byte{other, key}, Now: func() time.Time { return now }, Out: io.Discard})
	if err != nil {
		f.Fatal(err)
	}

	f.Fuzz(func(t *testing.T, id, ts string, body []byte, sig string, which uint8, pos uint16, x byte) {
		// Arbitrary headers.
		good := sign(key, id, ts, body)
		sig = strings.ReplaceAll(sig, "{head}", good[len("v1,"):len(good)-2])
		status, reason := serve(t, s, id, ts, sig, body)
		if status != http.StatusUnauthorized && status != http.StatusBadRequest && status != http.StatusRequestEntityTooLarge &&
			!hasEntry(sig, sign(key, id, ts, body)) && !hasEntry(sig, sign(other, id, ts, body)) {
			t.Fatalf("answered %d %s without the signature of id %q ts %q body %q (header %q)", status, reason, id, ts, body, sig)
		}

		// Signed here: the signature check passes; one change and it fails.
		if !s.signed(id, ts, body, good) {
			t.Fatalf("own signature refused: id %q ts %q body %q", id, ts, body)
		}
		mid, mts, mbody, msig := id, ts, body, good
		switch which % 4 {
		case 0:
			mid = mutate(id, pos, x)
		case 1:
			mts = mutate(ts, pos, x)
		case 2:
			mbody = []byte(mutate(string(body), pos, x))
		case 3:
			msig = mutateSig(good, pos, x)
		}
		if s.signed(mid, mts, mbody, msig) {
			t.Fatalf("mutation %d still verifies: id %q ts %q body %q sig %q (signed: %q)", which%4, mid, mts, mbody, msig, good)
		}
	})
}

// serve sends one request and checks the answer's shape: a documented
// status, and for refusals a JSON {"reason"} from the closed set.
func serve(t *testing.T, s *Sink, id, ts, sig string, body []byte) (int, string) {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/hook", bytes.NewReader(body))
	// Header values as a client could send them; net/http would refuse a
	// request line with CR or LF, so those never reach a handler.
	for k, v := range map[string]string{"webhook-id": id, "webhook-timestamp": ts, "webhook-signature": sig} {
		if v != "" && !strings.ContainsAny(v, "\r\n") {
			r.Header.Set(k, v)
		}
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	want := map[int][]string{
		http.StatusBadRequest:            {"missing_headers"},
		http.StatusUnauthorized:          {"bad_signature", "stale_timestamp"},
		http.StatusRequestEntityTooLarge: {"body_too_large"},
		http.StatusUnprocessableEntity:   {"bad_envelope"},
	}
	if w.Code == http.StatusNoContent {
		return w.Code, ""
	}
	var ans struct {
		Reason string `json:"reason"`
	}
	dec := json.NewDecoder(w.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ans); err != nil {
		t.Fatalf("status %d with body that is not {\"reason\"}: %v", w.Code, err)
	}
	for _, reason := range want[w.Code] {
		if reason == ans.Reason {
			return w.Code, ans.Reason
		}
	}
	t.Fatalf("status %d reason %q is not documented", w.Code, ans.Reason)
	return 0, ""
}

// hasEntry reports whether header holds entry as one of its
// space-separated entries.
func hasEntry(header, entry string) bool {
	for _, e := range strings.Fields(header) {
		if e == entry {
			return true
		}
	}
	return false
}

// mutate changes one byte of s (or appends one to an empty s).
func mutate(s string, pos uint16, x byte) string {
	if s == "" {
		return string([]byte{x})
	}
	b := []byte(s)
	b[int(pos)%len(b)] ^= x | 1
	return string(b)
}

// mutateSig changes one character of the base64 part of a "v1,..." entry to
// another base64 character: a receiver must look at the signature itself,
// not just at its decoded bytes' prefix, to refuse it.
func mutateSig(entry string, pos uint16, x byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	sig := []byte(strings.TrimPrefix(entry, "v1,"))
	i := int(pos) % len(sig)
	if sig[i] == '=' {
		i = 0
	}
	c := alphabet[int(x)%len(alphabet)]
	if c == sig[i] {
		c = alphabet[(int(x)+1)%len(alphabet)]
	}
	sig[i] = c
	return "v1," + string(sig)
}

// TestSignatureCanonicalText is the regression test of what FuzzVerify
// found (testdata/fuzz/FuzzVerify/trailing-bits): a v1 signature whose last
// base64 character differs only in the bits past the HMAC's 32 bytes
// decoded to the same bytes and passed; only the canonical text may.
func TestSignatureCanonicalText(t *testing.T) {
	h := newHarness(t, nil, mustSecret(t, vecSecret))
	head := vecSig[:len(vecSig)-2] // ...1O, then E=: E is 000100, its last 2 bits unused
	for _, end := range []string{"F=", "G=", "H=", "E", "E==", "Ew=="} {
		status, l := h.send(http.MethodPost, map[string]string{
			"webhook-id": vecID, "webhook-timestamp": vecTS, "webhook-signature": head + end,
		}, []byte(vecBody))
		if status != http.StatusUnauthorized || l.Reason != "bad_signature" {
			t.Errorf("signature ending %q: %d %s, want 401 bad_signature", end, status, l.Reason)
		}
	}
	if status, l := h.send(http.MethodPost, map[string]string{
		"webhook-id": vecID, "webhook-timestamp": vecTS, "webhook-signature": vecSig,
	}, []byte(vecBody)); status == http.StatusUnauthorized {
		t.Errorf("the canonical signature is refused: %d %s", status, l.Reason)
	}
}
