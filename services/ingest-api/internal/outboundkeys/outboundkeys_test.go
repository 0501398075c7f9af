package outboundkeys

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// seed is a fixed 32-byte seed; seedText is its base64url without padding.
var seed = bytes.Repeat([]byte{7}, 32)
var seedText = base64.RawURLEncoding.EncodeToString(seed)

func entry(tenant, keyID, seed string) string {
	return fmt.Sprintf(`%q:{"key_id":%q,"seed":%q}`, tenant, keyID, seed)
}

func TestParseAccepts(t *testing.T) {
	padded := base64.URLEncoding.EncodeToString(seed)
	if !strings.HasSuffix(padded, "=") {
		t.Fatal("test needs a padded form")
	}
	keys, err := Parse([]byte(`{` + entry("tenant-a", "out-1", seedText) + `,` + entry("tenant-b", "out.2", padded) + `}`))
	if err != nil {
		t.Fatal(err)
	}
	want := ed25519.NewKeyFromSeed(seed)
	if len(keys) != 2 || keys["tenant-a"].id != "out-1" || keys["tenant-b"].id != "out.2" ||
		!bytes.Equal(keys["tenant-a"].priv, want) || !bytes.Equal(keys["tenant-b"].priv, want) {
		t.Fatalf("keys = %v", keys)
	}
	if keys, err := Parse([]byte(` {} `)); err != nil || len(keys) != 0 {
		t.Fatalf("empty set: %v %v", keys, err)
	}
}

func TestParseRefuses(t *testing.T) {
	std := base64.StdEncoding.EncodeToString(append(bytes.Repeat([]byte{0xfb}, 31), 0xff)) // has + and /
	cases := map[string]string{
		"not json":          `seed-material`,
		"array":             `[]`,
		"null":              `null`,
		"duplicate tenant":  `{` + entry("tenant-a", "k", seedText) + `,` + entry("tenant-a", "k", seedText) + `}`,
		"duplicate member":  `{"tenant-a":{"key_id":"k","key_id":"k","seed":"` + seedText + `"}}`,
		"unknown member":    `{"tenant-a":{"key_id":"k","seed":"` + seedText + `","note":"x"}}`,
		"case-folded name":  `{"tenant-a":{"Key_ID":"k","seed":"` + seedText + `"}}`,
		"missing key_id":    `{"tenant-a":{"seed":"` + seedText + `"}}`,
		"missing seed":      `{"tenant-a":{"key_id":"k"}}`,
		"null seed":         `{"tenant-a":{"key_id":"k","seed":null}}`,
		"entry not object":  `{"tenant-a":"` + seedText + `"}`,
		"bad tenant":        `{` + entry("-tenant", "k", seedText) + `}`,
		"bad key id":        `{` + entry("tenant-a", "k id", seedText) + `}`,
		"short seed":        `{` + entry("tenant-a", "k", seedText[:40]) + `}`,
		"long seed":         `{` + entry("tenant-a", "k", seedText+"AAAA") + `}`,
		"standard alphabet": `{` + entry("tenant-a", "k", std) + `}`,
		"trailing data":     `{` + entry("tenant-a", "k", seedText) + `} {}`,
		"numeric seed":      `{"tenant-a":{"key_id":"k","seed":7}}`,
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(body))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
			if strings.Contains(err.Error(), seedText) || strings.Contains(err.Error(), "seed-material") {
				t.Fatalf("error quotes key material: %v", err)
			}
		})
	}
	if _, err := Parse(bytes.Repeat([]byte(" "), MaxFileBytes+1)); !errors.Is(err, ErrInvalid) {
		t.Fatalf("oversized file: %v", err)
	}
}

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	if _, err := OpenFile(path); err == nil {
		t.Fatal("a missing file opened")
	}
	write(t, path, `{`+entry("tenant-a", "out-1", seedText)+`}`)
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if id, priv, err := f.Key(ctx, "tenant-a"); err != nil || id != "out-1" || !bytes.Equal(priv, ed25519.NewKeyFromSeed(seed)) {
		t.Fatalf("Key = %q, %v", id, err)
	}
	if _, _, err := f.Key(ctx, "tenant-b"); !errors.Is(err, ErrNoKey) {
		t.Fatalf("unknown tenant: %v", err)
	}
	if changed, err := f.Reload(); changed || err != nil {
		t.Fatalf("unchanged file: changed=%v err=%v", changed, err)
	}

	// Rotation: a new key id and seed for tenant-a, and tenant-b added.
	seed2 := base64.RawURLEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32))
	write(t, path, `{`+entry("tenant-a", "out-2", seed2)+`,`+entry("tenant-b", "b-1", seedText)+`}`)
	if changed, err := f.Reload(); !changed || err != nil {
		t.Fatalf("rotation: changed=%v err=%v", changed, err)
	}
	if id, priv, _ := f.Key(ctx, "tenant-a"); id != "out-2" || !bytes.Equal(priv, ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, 32))) {
		t.Fatalf("after rotation: %q", id)
	}
	if f.Tenants() != 2 {
		t.Fatalf("tenants = %d", f.Tenants())
	}

	// A broken version is refused and the last good set stays.
	write(t, path, `{"tenant-a":{"key_id":"out-3","seed":"`+seed2[:10]+`"}}`)
	if changed, err := f.Reload(); changed || !errors.Is(err, ErrInvalid) || strings.Contains(err.Error(), seed2[:10]) {
		t.Fatalf("broken file: changed=%v err=%v", changed, err)
	}
	if id, _, err := f.Key(ctx, "tenant-a"); id != "out-2" || err != nil {
		t.Fatalf("last good set lost: %q %v", id, err)
	}
	// So does a deleted file.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if changed, err := f.Reload(); changed || err == nil {
		t.Fatalf("deleted file: changed=%v err=%v", changed, err)
	}
	if id, _, _ := f.Key(ctx, "tenant-b"); id != "b-1" {
		t.Fatalf("last good set lost after delete: %q", id)
	}
	// Removing a tenant takes its key away.
	write(t, path, `{`+entry("tenant-b", "b-1", seedText)+`}`)
	if changed, err := f.Reload(); !changed || err != nil {
		t.Fatalf("removal: changed=%v err=%v", changed, err)
	}
	if _, _, err := f.Key(ctx, "tenant-a"); !errors.Is(err, ErrNoKey) {
		t.Fatalf("removed tenant: %v", err)
	}
}

func TestNone(t *testing.T) {
	if _, _, err := (None{}).Key(context.Background(), "tenant-a"); !errors.Is(err, ErrNoKey) {
		t.Fatalf("None: %v", err)
	}
}

func TestRunStopsWithContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	write(t, path, `{}`)
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan struct{})
	go func() { f.Run(ctx, 1<<62, nil); close(done) }()
	<-done
}

// pubText is the base64url public key of seed s.
func pubText(s byte) string {
	return base64.RawURLEncoding.EncodeToString(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{s}, 32)).Public().(ed25519.PublicKey))
}

func TestParsePreviousKeys(t *testing.T) {
	body := `{"tenant-a":{"key_id":"out-2","seed":"` + seedText + `","previous":[` +
		`{"key_id":"out-1","public_key":"` + pubText(1) + `"},{"key_id":"out-0","public_key":"` + pubText(2) + `="}]},` +
		entry("tenant-b", "k", seedText) + `}`
	path := filepath.Join(t.TempDir(), "keys.json")
	write(t, path, body)
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	got, err := f.PublicKeys(ctx, "tenant-a")
	if err != nil || len(got) != 3 {
		t.Fatalf("%v %v", got, err)
	}
	want := []struct {
		id      string
		pub     string
		current bool
	}{{"out-2", base64.RawURLEncoding.EncodeToString(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey)), true},
		{"out-1", pubText(1), false}, {"out-0", pubText(2), false}}
	for i, w := range want {
		if got[i].KeyID != w.id || base64.RawURLEncoding.EncodeToString(got[i].Key) != w.pub || got[i].Current != w.current {
			t.Fatalf("key %d = %+v, want %+v", i, got[i], w)
		}
	}
	// The signing key stays the current one.
	if id, _, err := f.Key(ctx, "tenant-a"); err != nil || id != "out-2" {
		t.Fatalf("Key = %q %v", id, err)
	}
	if got, err := f.PublicKeys(ctx, "tenant-b"); err != nil || len(got) != 1 || !got[0].Current {
		t.Fatalf("without previous: %v %v", got, err)
	}
	if got, err := f.PublicKeys(ctx, "tenant-x"); err != nil || len(got) != 0 {
		t.Fatalf("unknown tenant: %v %v", got, err)
	}
	if got, err := PublicKeys(ctx, None{}, "tenant-a"); err != nil || len(got) != 0 {
		t.Fatalf("None: %v %v", got, err)
	}
}

// currentOnly is a Source that is not a Publisher, as a key-management
// service implementing only Source would be.
type currentOnly struct{ File *File }

func (c currentOnly) Key(ctx context.Context, tenant string) (string, ed25519.PrivateKey, error) {
	return c.File.Key(ctx, tenant)
}

func TestPublicKeysOfAPlainSource(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.json")
	write(t, path, `{`+entry("tenant-a", "k", seedText)+`}`)
	f, err := OpenFile(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := PublicKeys(context.Background(), currentOnly{f}, "tenant-a")
	if err != nil || len(got) != 1 || got[0].KeyID != "k" || !got[0].Current {
		t.Fatalf("%v %v", got, err)
	}
	if got, err := PublicKeys(context.Background(), currentOnly{f}, "other"); err != nil || len(got) != 0 {
		t.Fatalf("no key: %v %v", got, err)
	}
}

func TestParseRefusesBadPreviousKeys(t *testing.T) {
	head := `{"tenant-a":{"key_id":"k2","seed":"` + seedText + `","previous":`
	small := base64.RawURLEncoding.EncodeToString(append([]byte{1}, make([]byte, 31)...)) // the identity point: small order
	many := strings.Repeat(`{"key_id":"x","public_key":"`+pubText(1)+`"},`, MaxPreviousKeys+1)
	for name, prev := range map[string]string{
		"not array":      `{"key_id":"k1","public_key":"` + pubText(1) + `"}`,
		"null":           `null`,
		"item not obj":   `["` + pubText(1) + `"]`,
		"unknown member": `[{"key_id":"k1","public_key":"` + pubText(1) + `","seed":"` + seedText + `"}]`,
		"missing key":    `[{"key_id":"k1"}]`,
		"bad key id":     `[{"key_id":"k 1","public_key":"` + pubText(1) + `"}]`,
		"current again":  `[{"key_id":"k2","public_key":"` + pubText(1) + `"}]`,
		"twice":          `[{"key_id":"k1","public_key":"` + pubText(1) + `"},{"key_id":"k1","public_key":"` + pubText(2) + `"}]`,
		"short key":      `[{"key_id":"k1","public_key":"AAAA"}]`,
		"small order":    `[{"key_id":"k1","public_key":"` + small + `"}]`,
		"too many":       `[` + strings.TrimSuffix(many, ",") + `]`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(head + prev + `}}`))
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("err = %v", err)
			}
			if strings.Contains(err.Error(), seedText) || strings.Contains(err.Error(), pubText(1)) {
				t.Fatalf("error quotes key material: %v", err)
			}
		})
	}
}
