package signer

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
)

// FuzzSignature signs arbitrary (id, timestamp, body) with one or two
// secrets and checks that what the worker sends verifies — v1 entries with
// the official Standard Webhooks library, v1a entries with Ed25519 — and
// that changing the id, the timestamp, the body or the entry itself makes
// verification fail. text is also parsed as a secret as the secrets file
// would be: it must not panic, and a secret it accepts must sign.
//
// flags: bit 0 the first secret is v1a (whsk_, seed from key) instead of
// whsec_ key; bit 1 a second secret (a rotation), of the other scheme when
// bit 2 is set. which picks the mutation (id, timestamp, body, signature);
// pos and x say where and how.
func FuzzSignature(f *testing.F) {
	f.Add([]byte("0123456789abcdefghijklmnopqrstuv"), uint8(0), "msg_p5jXN8AQM9LWM0D4loKWxJek", int64(1614265330),
		[]byte(`{"test": 2432232314}`), "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", uint8(3), uint16(5), byte(1))
	// The shared vectors (testdata/webhooks.json, a copy of vectors/webhooks.json).
	data, err := os.ReadFile("testdata/webhooks.json")
	if err != nil {
		f.Fatal(err)
	}
	var file struct{ Vectors []vector }
	if err := json.Unmarshal(data, &file); err != nil || len(file.Vectors) == 0 {
		f.Fatalf("vectors: %v", err)
	}
	for _, v := range file.Vectors {
		ts, err := strconv.ParseInt(v.Timestamp, 10, 64)
		if err != nil {
			f.Fatal(err)
		}
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(v.Secret, "whsec_"))
		if err != nil {
			f.Fatal(err)
		}
		for which := uint8(0); which < 4; which++ {
			f.Add(key, uint8(0), v.ID, ts, []byte(v.Body), v.Secret, which, uint16(7), byte(0x20))
		}
	}
	f.Add([]byte{}, uint8(7), "", int64(-1), []byte{}, "whsk_", uint8(1), uint16(0), byte(0))

	f.Fuzz(func(t *testing.T, key []byte, flags uint8, id string, ts int64, body []byte, text string, which uint8, pos uint16, x byte) {
		if s, err := secrets.ParseSecret(text); err == nil {
			if _, err := Signature(id, time.Unix(ts, 0), body, []secrets.Secret{s}); err != nil {
				t.Fatalf("accepted secret does not sign: %v", err)
			}
		}
		secs := []secrets.Secret{makeSecret(t, key, flags&1 == 1)}
		if flags&2 != 0 {
			secs = append(secs, makeSecret(t, append([]byte("rotated"), key...), (flags&1 == 1) != (flags&4 != 0)))
		}
		at := time.Unix(ts, 0)
		h := http.Header{}
		if err := SetHeaders(h, id, at, body, secs); err != nil {
			t.Fatal(err)
		}
		if got := h.Get(HeaderTimestamp); got != strconv.FormatInt(ts, 10) {
			t.Fatalf("webhook-timestamp %q for %d", got, ts)
		}
		if h.Get(HeaderID) != id || h.Get(HeaderIdempotency) != id {
			t.Fatalf("webhook-id %q, Idempotency-Key %q, want %q", h.Get(HeaderID), h.Get(HeaderIdempotency), id)
		}
		entries := strings.Split(h.Get(HeaderSignature), " ")
		if len(entries) != len(secs) {
			t.Fatalf("%d entries for %d secrets: %q", len(entries), len(secs), h.Get(HeaderSignature))
		}
		tsText := strconv.FormatInt(ts, 10)
		for i, s := range secs {
			if !verifies(t, s, id, tsText, body, entries[i]) {
				t.Fatalf("entry %d (%s) does not verify: %q", i, s.Scheme(), entries[i])
			}
		}

		// One mutation; every secret's entry must then fail.
		mid, mts, mbody := id, tsText, body
		ment := append([]string(nil), entries...)
		switch which % 4 {
		case 0:
			mid = mutateString(id, pos, x)
		case 1:
			mts = strconv.FormatInt(ts+1+int64(x), 10)
		case 2:
			mbody = []byte(mutateString(string(body), pos, x))
		case 3:
			for i := range ment {
				ment[i] = mutateEntry(ment[i], pos, x)
			}
		}
		for i, s := range secs {
			if verifies(t, s, mid, mts, mbody, ment[i]) {
				t.Fatalf("mutation %d still verifies entry %d (%s): id %q ts %s body %q entry %q",
					which%4, i, s.Scheme(), mid, mts, mbody, ment[i])
			}
		}
	})
}

// makeSecret turns fuzz bytes into a valid secret: a whsec_ key of 24-64
// bytes, or a whsk_ seed.
func makeSecret(t *testing.T, key []byte, ed bool) secrets.Secret {
	t.Helper()
	var text string
	if ed {
		seed := sha256.Sum256(key)
		text = "whsk_" + base64.StdEncoding.EncodeToString(seed[:])
	} else {
		k := append([]byte(nil), key...)
		for len(k) < secrets.MinHMACKeyBytes {
			k = append(k, byte(len(k)))
		}
		if len(k) > secrets.MaxHMACKeyBytes {
			k = k[:secrets.MaxHMACKeyBytes]
		}
		text = "whsec_" + base64.StdEncoding.EncodeToString(k)
	}
	s, err := secrets.ParseSecret(text)
	if err != nil {
		t.Fatalf("secret %s refused: %v", text[:5], err)
	}
	return s
}

// verifies checks one signature entry as a receiver would: v1 with the
// official Standard Webhooks library (which recomputes and compares the
// base64 text), v1a with Ed25519 over id.timestamp.body.
func verifies(t *testing.T, s secrets.Secret, id, ts string, body []byte, entry string) bool {
	t.Helper()
	switch s.Scheme() {
	case secrets.HMACSHA256:
		wh, err := standardwebhooks.NewWebhookRaw(s.HMACKey())
		if err != nil {
			t.Fatal(err)
		}
		if id == "" || strings.ContainsAny(entry, " ") {
			// The library treats an empty id as a missing header; space
			// splits entries. Fall back to the comparison it makes.
			return entry == refV1(s.HMACKey(), id, ts, body)
		}
		if _, err := strconv.ParseInt(ts, 10, 64); err != nil {
			return false
		}
		h := http.Header{}
		h.Set(HeaderID, id)
		h.Set(HeaderTimestamp, ts)
		h.Set(HeaderSignature, entry)
		lib := wh.VerifyIgnoringTimestamp(body, h) == nil
		if ref := entry == refV1(s.HMACKey(), id, ts, body); ref != lib {
			t.Fatalf("official library says %v, recomputed comparison %v", lib, ref)
		}
		return lib
	case secrets.Ed25519:
		sig, ok := strings.CutPrefix(entry, "v1a,")
		if !ok {
			return false
		}
		raw, err := base64.StdEncoding.Strict().DecodeString(sig)
		if err != nil || base64.StdEncoding.EncodeToString(raw) != sig {
			return false
		}
		content := []byte(id + "." + ts + "." + string(body))
		return ed25519.Verify(s.Ed25519Key().Public().(ed25519.PublicKey), content, raw)
	}
	t.Fatalf("scheme %s", s.Scheme())
	return false
}

func refV1(key []byte, id, ts string, body []byte) string {
	wh, _ := standardwebhooks.NewWebhookRaw(key)
	n, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "\x00"
	}
	sig, _ := wh.Sign(id, time.Unix(n, 0), body)
	return sig
}

// mutateString changes one byte of s (or appends one to an empty s); the
// result always differs from s.
func mutateString(s string, pos uint16, x byte) string {
	if s == "" {
		return string([]byte{x})
	}
	b := []byte(s)
	i := int(pos) % len(b)
	b[i] ^= x | 1
	return string(b)
}

// mutateEntry changes one character of the signature part of an entry to
// another base64 character, keeping its scheme prefix, so the receiver has
// to look at the signature itself to refuse it.
func mutateEntry(e string, pos uint16, x byte) string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	prefix, sig, ok := strings.Cut(e, ",")
	if !ok || sig == "" {
		return e + "A"
	}
	b := []byte(sig)
	i := int(pos) % len(b)
	if b[i] == '=' {
		i = 0
	}
	c := alphabet[int(x)%len(alphabet)]
	if c == b[i] {
		c = alphabet[(int(x)+1)%len(alphabet)]
	}
	b[i] = c
	return prefix + "," + string(b)
}
