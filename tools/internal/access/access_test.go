package access

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecodeBase64URL(t *testing.T) {
	raw := []byte{0xfb, 0xff, 0x01, 0x02} // has - and _ in base64url, and two padding characters
	unpadded := base64.RawURLEncoding.EncodeToString(raw)
	padded := base64.URLEncoding.EncodeToString(raw)
	for _, s := range []string{unpadded, padded, " " + padded + "\n"} {
		got, err := DecodeBase64URL(s)
		if err != nil || !bytes.Equal(got, raw) {
			t.Errorf("DecodeBase64URL(%q) = %x, %v; want %x", s, got, err, raw)
		}
	}
	for _, s := range []string{
		padded[:len(padded)-1],                 // half the padding
		base64.StdEncoding.EncodeToString(raw), // + and / are not base64url
		unpadded[:len(unpadded)-1] + "9",       // non-zero trailing bits
		"@@@@",
	} {
		if _, err := DecodeBase64URL(s); err == nil {
			t.Errorf("DecodeBase64URL(%q) accepted", s)
		}
	}
}

func TestParseSeed(t *testing.T) {
	seed := bytes.Repeat([]byte{7}, SeedSize)
	want := ed25519.NewKeyFromSeed(seed)
	for _, s := range []string{EncodeBase64URL(seed), base64.URLEncoding.EncodeToString(seed)} {
		priv, err := ParseSeed(s)
		if err != nil || !priv.Equal(want) {
			t.Fatalf("ParseSeed(%q) = %v", s, err)
		}
	}
	for _, s := range []string{"", EncodeBase64URL(seed[:31]), EncodeBase64URL(append(seed, 1)), "not base64!"} {
		if _, err := ParseSeed(s); err == nil {
			t.Errorf("ParseSeed(%q) accepted", s)
		}
	}
}

func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	seedPath := filepath.Join(dir, "seed")
	seed := bytes.Repeat([]byte{9}, SeedSize)
	if err := WriteSecretFile(seedPath, EncodeBase64URL(seed)+"\n"); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(seedPath)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("seed file mode %v, want 0600", fi.Mode().Perm())
	}
	if err := WriteSecretFile(seedPath, "other"); !errors.Is(err, os.ErrExist) {
		t.Errorf("overwriting a secret file: %v, want ErrExist", err)
	}
	priv, err := ReadSeedFile(seedPath)
	if err != nil || !priv.Equal(ed25519.NewKeyFromSeed(seed)) {
		t.Fatalf("ReadSeedFile: %v", err)
	}

	tokPath := filepath.Join(dir, "token")
	if err := WriteSecretFile(tokPath, "ewc_abc-DEF_123\n"); err != nil {
		t.Fatal(err)
	}
	if tok, err := ReadTokenFile(tokPath); err != nil || tok != "ewc_abc-DEF_123" {
		t.Errorf("ReadTokenFile = %q, %v", tok, err)
	}

	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, bytes.Repeat([]byte("a"), maxSecretFile+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTokenFile(big); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized token file: %v", err)
	}
	if _, err := ReadSeedFile(tokPath); err == nil {
		t.Error("a token file was accepted as a seed")
	}
	if _, err := ReadSeedFile(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing seed file: %v", err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadTokenFile(empty); err == nil {
		t.Error("an empty token file was accepted")
	}
}

func TestCheckToken(t *testing.T) {
	if err := CheckToken("abc.DEF-_~"); err != nil {
		t.Errorf("printable token refused: %v", err)
	}
	for _, tok := range []string{"", "a b", "a\nb", "tök"} {
		if CheckToken(tok) == nil {
			t.Errorf("CheckToken(%q) accepted", tok)
		}
	}
}

func TestCheckURL(t *testing.T) {
	ok := []struct {
		raw          string
		loopbackOnly bool
		want         string
	}{
		{"http://127.0.0.1:8080", true, "http://127.0.0.1:8080/v1/envelopes"},
		{"http://127.0.0.2:8080/", true, "http://127.0.0.2:8080/v1/envelopes"},
		{"http://localhost:8080/base/", true, "http://localhost:8080/base/v1/envelopes"},
		{"http://[::1]:8080", true, "http://[::1]:8080/v1/envelopes"},
		{"https://ingest.example.com", false, "https://ingest.example.com/v1/envelopes"},
	}
	for _, c := range ok {
		u, err := CheckURL(c.raw, c.loopbackOnly)
		if err != nil {
			t.Errorf("CheckURL(%q) = %v", c.raw, err)
			continue
		}
		if got := Endpoint(u, "/v1/envelopes"); got != c.want {
			t.Errorf("Endpoint(%q) = %q, want %q", c.raw, got, c.want)
		}
	}
	bad := []struct {
		raw          string
		loopbackOnly bool
		msg          string
	}{
		{"http://ingest.example.com", false, "plain http"},
		{"http://10.0.0.1:8080", false, "plain http"},
		{"https://ingest.example.com", true, "only loopback"},
		{"ftp://127.0.0.1", false, "scheme"},
		{"//127.0.0.1:8080", false, "scheme"},
		{"127.0.0.1:8080", false, "does not parse"},
		{"http://", false, "no host"},
		{"http://user:pw@127.0.0.1", false, "user info"},
		{"http://127.0.0.1/?a=b", false, "without query"},
		{"http://[::1", false, "does not parse"},
	}
	for _, c := range bad {
		_, err := CheckURL(c.raw, c.loopbackOnly)
		if err == nil || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("CheckURL(%q, %v) = %v, want an error about %q", c.raw, c.loopbackOnly, err, c.msg)
		}
		if err != nil && strings.Contains(err.Error(), "pw@") {
			t.Errorf("CheckURL echoed a password: %v", err)
		}
	}
}

// A refused URL's user info and query never reach the error: each of these
// is refused, and each error still names the host.
func TestCheckURLErrorsHoldNoSecret(t *testing.T) {
	for _, raw := range []string{
		"http://user-1:pass-1@127.0.0.1:8080",
		"https://127.0.0.1:8080/?token=tok-1",
		"https://user-1@127.0.0.1:8080/#tok-1",
		"http://ingest.example.com/?token=tok-1",
		"ftp://user-1:pass-1@127.0.0.1/?token=tok-1",
	} {
		_, err := CheckURL(raw, false)
		if err == nil {
			t.Errorf("CheckURL(%q) accepted", raw)
			continue
		}
		for _, secret := range []string{"user-1", "pass-1", "tok-1"} {
			if strings.Contains(err.Error(), secret) {
				t.Errorf("CheckURL(%q): %v holds %q", raw, err, secret)
			}
		}
		if !strings.Contains(err.Error(), "example.com") && !strings.Contains(err.Error(), "127.0.0.1") {
			t.Errorf("CheckURL(%q): %v does not name the host", raw, err)
		}
	}
}

func TestPost(t *testing.T) {
	var got struct {
		method, path, auth, ctype, idem string
		body                            []byte
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got.method, got.path = r.Method, r.URL.Path
		got.auth, got.ctype, got.idem = r.Header.Get("Authorization"), r.Header.Get("Content-Type"), r.Header.Get("Idempotency-Key")
		got.body, _ = io.ReadAll(r.Body)
		w.Header().Set("X-Correlation-Id", "c-1")
		w.WriteHeader(http.StatusConflict)
		io.WriteString(w, `{"outcome":"refused","reason":"event_conflict"}`)
	}))
	defer srv.Close()
	u, err := CheckURL(srv.URL, true)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("Idempotency-Key", "k-1")
	ans, err := Post(context.Background(), srv.Client(), Endpoint(u, "/v1/envelopes"), "tok", []byte(`{"a":1}`), h)
	if err != nil {
		t.Fatal(err)
	}
	if ans.Status != http.StatusConflict || string(ans.Body) != `{"outcome":"refused","reason":"event_conflict"}` || ans.CorrelationID != "c-1" {
		t.Errorf("answer = %+v", ans)
	}
	if got.method != http.MethodPost || got.path != "/v1/envelopes" || got.auth != "Bearer tok" ||
		got.ctype != "application/json" || got.idem != "k-1" || string(got.body) != `{"a":1}` {
		t.Errorf("request = %+v", got)
	}

	srv.Close()
	if _, err := Post(context.Background(), srv.Client(), Endpoint(u, "/v1/envelopes"), "tok", nil, nil); err == nil {
		t.Error("posting to a closed server succeeded")
	}
}
