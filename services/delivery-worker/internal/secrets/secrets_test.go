package secrets

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const vectorSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw" // 24 bytes decoded

func b64(n int, fill byte) string {
	return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{fill}, n))
}

func TestParseSecret(t *testing.T) {
	seed := bytes.Repeat([]byte{7}, 32)
	priv := ed25519.NewKeyFromSeed(seed)
	badPriv := append(append([]byte{}, seed...), bytes.Repeat([]byte{1}, 32)...)
	cases := []struct {
		name, text string
		scheme     Scheme
		wantErr    string
	}{
		{"vector", vectorSecret, HMACSHA256, ""},
		{"unpadded", "whsec_" + strings.TrimRight(b64(32, 1), "="), HMACSHA256, ""},
		{"max", "whsec_" + b64(64, 1), HMACSHA256, ""},
		{"empty", "", "", "empty secret"},
		{"prefix only", "whsec_", "", "shorter than 24"},
		{"short", "whsec_" + b64(23, 1), "", "shorter than 24"},
		{"long", "whsec_" + b64(65, 1), "", "longer than 64"},
		{"not base64", "whsec_!!!!not-base64!!!!!!!!!!!!!!!!", "", "not base64"},
		{"no prefix", b64(32, 1), "", "must start with"},
		{"seed", "whsk_" + base64.StdEncoding.EncodeToString(seed), Ed25519, ""},
		{"private key", "whsk_" + base64.StdEncoding.EncodeToString(priv), Ed25519, ""},
		{"mismatched private key", "whsk_" + base64.StdEncoding.EncodeToString(badPriv), "", "public half"},
		{"short ed25519", "whsk_" + b64(31, 1), "", "32-byte seed"},
		{"public key", "whpk_" + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)), "", "public key for receivers"},
	}
	for _, c := range cases {
		s, err := ParseSecret(c.text)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: err = %v, want %q", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if s.Scheme() != c.scheme {
			t.Errorf("%s: scheme %s, want %s", c.name, s.Scheme(), c.scheme)
		}
	}
	s, _ := ParseSecret("whsk_" + base64.StdEncoding.EncodeToString(seed))
	if !bytes.Equal(s.Ed25519Key(), priv) {
		t.Error("seed did not expand to the expected private key")
	}
	if want := "whpk_" + base64.StdEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)); s.PublicKey() != want {
		t.Errorf("PublicKey = %s, want %s", s.PublicKey(), want)
	}
}

func TestSecretNeverPrints(t *testing.T) {
	s, err := ParseSecret(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	key := s.HMACKey()
	for _, out := range []string{fmt.Sprint(s), fmt.Sprintf("%v %+v %#v", s, s, s)} {
		if strings.Contains(out, "MfKQ9r8") || bytes.Contains([]byte(out), key) {
			t.Fatalf("secret printed: %q", out)
		}
	}
}

func TestParseFile(t *testing.T) {
	good := `{"ep-a":["` + vectorSecret + `"],"ep-b":["whsec_` + b64(32, 2) + `","whsec_` + b64(32, 3) + `"]}`
	set, err := Parse([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if set.Len() != 2 || len(set.Lookup("ep-a")) != 1 || len(set.Lookup("ep-b")) != 2 || set.Lookup("nope") != nil {
		t.Fatalf("unexpected set: %d refs", set.Len())
	}
	if !bytes.Equal(set.Lookup("ep-b")[0].HMACKey(), bytes.Repeat([]byte{2}, 32)) {
		t.Error("secrets not kept in file order")
	}

	short := "whsec_" + b64(10, 9)
	refused := []struct{ name, data, want string }{
		{"not json", `{"a":`, "not a JSON object"},
		{"array", `["whsec_x"]`, "not a JSON object"},
		{"null", `null`, "not a JSON object"},
		{"string values", `{"a":"` + vectorSecret + `"}`, "not a JSON object"},
		{"trailing", good + `{}`, "trailing data"},
		{"empty list", `{"a":[]}`, `ref "a" has no secrets`},
		{"empty ref", `{"":["` + vectorSecret + `"]}`, "empty secret ref"},
		{"empty secret", `{"a":[""]}`, `ref "a" secret 1: empty secret`},
		{"short secret", `{"a":["` + vectorSecret + `","` + short + `"]}`, `ref "a" secret 2: whsec_ secret shorter`},
	}
	for _, c := range refused {
		_, err := Parse([]byte(c.data))
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v, want ErrInvalid containing %q", c.name, err, c.want)
			continue
		}
		if strings.Contains(err.Error(), "MfKQ9r8") || strings.Contains(err.Error(), short[6:]) {
			t.Errorf("%s: error leaks a secret: %v", c.name, err)
		}
	}
}

func TestLoadRefusesHugeAndMissingFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := Load(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
	big := filepath.Join(dir, "big.json")
	if err := os.WriteFile(big, bytes.Repeat([]byte(" "), maxFileBytes+1), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(big); !errors.Is(err, ErrInvalid) {
		t.Errorf("huge file: %v, want ErrInvalid", err)
	}
}

func TestWatcherRotates(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "secrets.json")
	write := func(s string) {
		t.Helper()
		// Write then rename, as a mounted Secret is updated.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	oldS, newS := "whsec_"+b64(32, 1), "whsec_"+b64(32, 2)
	write(`{"ep":["` + oldS + `"]}`)
	set, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	cur := NewCurrent(set)
	var logs bytes.Buffer
	var outcomes []bool
	w := &Watcher{Path: path, Current: cur, Log: slog.New(slog.NewJSONHandler(&logs, nil)), OnReload: func(ok bool) { outcomes = append(outcomes, ok) }}
	last := set.sum

	last = w.Poll(last) // unchanged: nothing happens
	if len(outcomes) != 0 {
		t.Fatalf("unchanged file reloaded: %v", outcomes)
	}

	write(`{"ep":["` + oldS + `","` + newS + `"]}`) // rotation: both valid
	last = w.Poll(last)
	if got := cur.Lookup("ep"); len(got) != 2 || !bytes.Equal(got[1].HMACKey(), bytes.Repeat([]byte{2}, 32)) {
		t.Fatalf("rotation not picked up: %d secrets", len(got))
	}

	write(`{"ep":["whsec_c2hvcnQ="]}`) // a bad file keeps the previous set
	last = w.Poll(last)
	if got := cur.Lookup("ep"); len(got) != 2 {
		t.Fatalf("bad file replaced the set: %d secrets", len(got))
	}
	last = w.Poll(last) // the same bad file is reported once
	if want := []bool{true, false}; fmt.Sprint(outcomes) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v", outcomes, want)
	}

	write(`{"ep":["` + newS + `"]}`) // old secret retired
	w.Poll(last)
	if got := cur.Lookup("ep"); len(got) != 1 || !bytes.Equal(got[0].HMACKey(), bytes.Repeat([]byte{2}, 32)) {
		t.Fatalf("retirement not picked up")
	}
	if strings.Contains(logs.String(), oldS[6:]) || strings.Contains(logs.String(), newS[6:]) || strings.Contains(logs.String(), "c2hvcnQ") {
		t.Fatalf("logs leak a secret: %s", logs.String())
	}
}
