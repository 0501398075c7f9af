package envelope

import (
	"bytes"
	"crypto/ed25519"
	"strconv"
	"testing"
	"time"
)

// benchBody returns a signed envelope of about size bytes whose payload is
// written in non-canonical member order with white space, so Parse has to
// reorder and re-encode like it would for a typical device.
func benchBody(tb testing.TB, size int) ([]byte, ed25519.PublicKey) {
	tb.Helper()
	priv := vectorKey(tb)
	var payload []byte
	build := func(n int) []byte {
		p := []byte(`{"records": [`)
		for i := range n {
			if i > 0 {
				p = append(p, ", "...)
			}
			p = append(p, `{"value": `...)
			p = strconv.AppendFloat(p, float64(i)+0.25, 'f', -1, 64)
			p = append(p, `, "name": "item-`...)
			p = strconv.AppendInt(p, int64(i), 10)
			p = append(p, `", "tags": ["alpha", "beta\u00e9"], "ok": true}`...)
		}
		return append(p, `], "count": 1E2}`...)
	}
	d := basicDraft()
	d.IssuedAt = time.Date(2026, 11, 29, 20, 0, 0, 0, time.UTC)
	var body []byte
	for n := 1; ; n++ {
		payload = build(n)
		d.Payload = payload
		e, err := Sign(d, priv)
		if err != nil {
			tb.Fatal(err)
		}
		c := e.Canonical()
		i := bytes.Index(c, e.Payload)
		body = append(append(append([]byte(nil), c[:i]...), payload...), c[i+len(e.Payload):]...)
		if len(body) >= size {
			break
		}
	}
	return body, priv.Public().(ed25519.PublicKey)
}

func TestBenchBodyIsValid(t *testing.T) {
	for _, size := range []int{1 << 10, 64 << 10} {
		body, pub := benchBody(t, size)
		e, err := Parse(body)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.Verify(pub); err != nil {
			t.Fatal(err)
		}
		if bytes.Equal(body, e.Canonical()) {
			t.Fatal("bench body is already canonical")
		}
	}
}

func benchFull(b *testing.B, size int) {
	body, pub := benchBody(b, size)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		e, err := Parse(body)
		if err != nil {
			b.Fatal(err)
		}
		if err := e.Verify(pub); err != nil {
			b.Fatal(err)
		}
	}
}

func benchParse(b *testing.B, size int) {
	body, _ := benchBody(b, size)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(body); err != nil {
			b.Fatal(err)
		}
	}
}

// Parse + canonicalize + verify: the per-envelope work of steps 2 and 3.
func BenchmarkEnvelope1KiB(b *testing.B)  { benchFull(b, 1<<10) }
func BenchmarkEnvelope64KiB(b *testing.B) { benchFull(b, 64<<10) }

// Everything except the signature check.
func BenchmarkParse1KiB(b *testing.B)  { benchParse(b, 1<<10) }
func BenchmarkParse64KiB(b *testing.B) { benchParse(b, 64<<10) }

// ed25519.Verify alone on the 1 KiB envelope's signing input: the yardstick
// for "everything else costs less than half of this".
func BenchmarkEd25519Verify1KiB(b *testing.B) {
	benchVerify(b, func(pub, msg, sig []byte) bool { return ed25519.Verify(pub, msg, sig) })
}

func BenchmarkCanonicalize64KiB(b *testing.B) {
	body, _ := benchBody(b, 64<<10)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonicalize(body); err != nil {
			b.Fatal(err)
		}
	}
}

// VerifySignature (ZIP-215, what Envelope.Verify uses) on the same input as
// BenchmarkEd25519Verify1KiB.
func BenchmarkVerifySignature1KiB(b *testing.B) {
	benchVerify(b, func(pub, msg, sig []byte) bool { return VerifySignature(pub, msg, sig) })
}

// benchVerify times verify on the 1 KiB envelope's signing input.
func benchVerify(b *testing.B, verify func(pub, msg, sig []byte) bool) {
	body, pub := benchBody(b, 1<<10)
	e, err := Parse(body)
	if err != nil {
		b.Fatal(err)
	}
	msg, sig := e.SigningInput(), e.Signature
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if !verify(pub, msg, sig) {
			b.Fatal("does not verify")
		}
	}
}

// BenchmarkBatchVerify checks n signatures of one key over distinct 1 KiB
// signing inputs (a batch from one device); ns/sig is the cost per
// signature, to set against BenchmarkEd25519Verify1KiB in the same run.
func BenchmarkBatchVerify(b *testing.B) {
	body, pub := benchBody(b, 1<<10)
	e, err := Parse(body)
	if err != nil {
		b.Fatal(err)
	}
	priv := vectorKey(b)
	for _, n := range []int{1, 16, 64, 100} {
		msgs, sigs := make([][]byte, n), make([][]byte, n)
		for i := range n {
			msgs[i] = append(strconv.AppendInt(nil, int64(i), 10), e.SigningInput()...)
			sigs[i] = ed25519.Sign(priv, msgs[i])
		}
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				v := NewBatchVerifier(n)
				for i := range n {
					v.Add(pub, msgs[i], sigs[i])
				}
				if all, _ := v.Verify(); !all {
					b.Fatal("batch does not verify")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/sig")
		})
	}
}
