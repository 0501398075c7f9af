package receiver

import (
	"bytes"
	"crypto/ed25519"
	"strconv"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/envelope"
)

// BenchmarkVerify measures one delivery through Verify (headers, body read,
// webhook signature, envelope parse and signature) against the envelope
// checks alone (parse and Ed25519 verify), the baseline a receiver pays
// anyway, for a 4 KiB payload.
func BenchmarkVerify(b *testing.B) {
	e, err := envelope.Sign(envelope.Draft{
		TenantID: "t1", ProjectID: "p1", ProducerID: "svc", EventID: "e-1", IdempotencyKey: "k-1", KeyID: "k1",
		Sequence: 1, IssuedAt: testNow, Metadata: envelope.Metadata{Kind: "proposal"},
		Payload: []byte(`{"blob":"` + string(bytes.Repeat([]byte("x"), 4096)) + `"}`),
	}, envPriv)
	if err != nil {
		b.Fatal(err)
	}
	body := e.Canonical()
	ts := strconv.FormatInt(testNow.Unix(), 10)
	v := newTestVerifier(b)
	pub := envPriv.Public().(ed25519.PublicKey)
	b.Run("envelope-only", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		for b.Loop() {
			env, err := envelope.Parse(body)
			if err != nil || env.Verify(pub) != nil {
				b.Fatal(err)
			}
		}
	})
	for _, c := range []struct{ name, sig string }{
		{"v1", v1Entry(hmacKey, "msg_1", ts, body)},
		{"v1a", v1aEntry(whPriv, "msg_1", ts, body)},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			r := delivery("msg_1", time.Unix(testNow.Unix(), 0), body, c.sig)
			for b.Loop() {
				r.Body = nopCloser{bytes.NewReader(body)}
				if _, err := v.Verify(r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type nopCloser struct{ *bytes.Reader }

func (nopCloser) Close() error { return nil }
