package signer

import (
	"bytes"
	"encoding/base64"
	"net/http"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/secrets"
)

func BenchmarkSetHeaders(b *testing.B) {
	hmacSecret, err := secrets.ParseSecret("whsec_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32)))
	if err != nil {
		b.Fatal(err)
	}
	edSecret, err := secrets.ParseSecret("whsk_" + base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 32)))
	if err != nil {
		b.Fatal(err)
	}
	body := bytes.Repeat([]byte("x"), 4096)
	ts := time.Unix(1614265330, 0)
	for _, c := range []struct {
		name string
		secs []secrets.Secret
	}{
		{"v1", []secrets.Secret{hmacSecret}},
		{"v1+v1_rotation", []secrets.Secret{hmacSecret, hmacSecret}},
		{"v1a", []secrets.Secret{edSecret}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if err := SetHeaders(http.Header{}, "msg_0123456789abcdef01234567", ts, body, c.secs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
