package envelope

import (
	"strings"
	"testing"
)

func TestTraceparentOf(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	priv := vectorKey(t)
	sign := func(t *testing.T, md Metadata, payload string) []byte {
		t.Helper()
		d := basicDraft()
		d.Metadata, d.Payload = md, []byte(payload)
		e, err := Sign(d, priv)
		if err != nil {
			t.Fatal(err)
		}
		return e.Canonical()
	}
	decoy := `{"metadata":{"traceparent":"00-11111111111111111111111111111111-2222222222222222-01"}}`
	for _, tc := range []struct {
		name string
		doc  []byte
		want string
	}{
		{"with traceparent", sign(t, Metadata{Kind: "k", Traceparent: tp}, `{}`), tp},
		{"with correlation id too", sign(t, Metadata{Kind: "k", CorrelationID: "c-1", Traceparent: tp}, `[1]`), tp},
		{"without", sign(t, Metadata{Kind: "k"}, `{}`), ""},
		{"payload decoy, none in metadata", sign(t, Metadata{Kind: "k"}, decoy), ""},
		{"payload decoy, one in metadata", sign(t, Metadata{Kind: "k", Traceparent: tp}, decoy), tp},
		{"idempotency key decoy", func() []byte {
			d := basicDraft()
			d.IdempotencyKey = `x"metadata":{"traceparent":"` + tp[:20]
			d.Metadata = Metadata{Kind: "k"}
			e, err := Sign(d, priv)
			if err != nil {
				t.Fatal(err)
			}
			return e.Canonical()
		}(), ""},
		{"empty", nil, ""},
		{"not json", []byte("garbage"), ""},
		{"truncated value", []byte(`{"metadata":{"kind":"k","traceparent":"` + tp[:40]), ""},
		{"invalid value", []byte(`{"metadata":{"kind":"k","traceparent":"` + strings.ToUpper(tp) + `"}}`), ""},
		{"longer value", []byte(`{"metadata":{"kind":"k","traceparent":"` + tp + `-00"}}`), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := TraceparentOf(tc.doc); got != tc.want {
				t.Fatalf("TraceparentOf = %q, want %q", got, tc.want)
			}
		})
	}
}

func BenchmarkTraceparentOf(b *testing.B) {
	d := basicDraft()
	d.Metadata.Traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	d.Payload = []byte(`"` + strings.Repeat("x", 512<<10) + `"`)
	e, err := Sign(d, vectorKey(b))
	if err != nil {
		b.Fatal(err)
	}
	doc := e.Canonical()
	b.ReportAllocs()
	for b.Loop() {
		if TraceparentOf(doc) == "" {
			b.Fatal("not found")
		}
	}
}
