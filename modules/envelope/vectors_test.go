package envelope

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"os"
	"testing"
	"time"
)

// testdata/envelopes.json is a verbatim copy of the contract's shared test
// vectors (shared/vectors/envelopes.json next to the contract), made with an
// independent RFC 8785 implementation. Keep it in sync when the contract
// changes; it is copied so this module's tests depend on nothing outside it.
type vectorFile struct {
	PrivateSeedHex     string `json:"private_seed_hex"`
	PublicKeyBase64URL string `json:"public_key_base64url"`
	Vectors            []struct {
		Name                 string `json:"name"`
		Body                 string `json:"body"`
		SigningInputBase64   string `json:"signing_input_base64"`
		ContentDigest        string `json:"content_digest"`
		EventIdentity        string `json:"event_identity"`
		IdempotencyDigest    string `json:"idempotency_digest"`
		ExpectValidSignature bool   `json:"expect_valid_signature"`
		ExpectReason         string `json:"expect_reason"`
	} `json:"vectors"`
}

func loadVectors(t testing.TB) vectorFile {
	t.Helper()
	raw, err := os.ReadFile("testdata/envelopes.json")
	if err != nil {
		t.Fatal(err)
	}
	var vf vectorFile
	if err := json.Unmarshal(raw, &vf); err != nil {
		t.Fatal(err)
	}
	if len(vf.Vectors) == 0 {
		t.Fatal("no vectors")
	}
	return vf
}

// vectorNow lies within every vector's window: they are issued at 20:00Z.
var vectorNow = time.Date(2026, 11, 29, 20, 1, 0, 0, time.UTC)

func TestSharedVectors(t *testing.T) {
	vf := loadVectors(t)
	pub, err := ParsePublicKey(vf.PublicKeyBase64URL)
	if err != nil {
		t.Fatalf("vector public key: %v", err)
	}
	seed, _ := hex.DecodeString(vf.PrivateSeedHex)
	if !bytes.Equal(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey), pub) {
		t.Fatal("vector seed and public key disagree")
	}
	for _, v := range vf.Vectors {
		t.Run(v.Name, func(t *testing.T) {
			e, err := Parse([]byte(v.Body))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if v.SigningInputBase64 != "" {
				want, _ := base64.StdEncoding.DecodeString(v.SigningInputBase64)
				if !bytes.Equal(e.SigningInput(), want) {
					t.Fatalf("signing input\n got %q\nwant %q", e.SigningInput(), want)
				}
				cd := e.ContentDigest()
				if hex.EncodeToString(cd[:]) != v.ContentDigest {
					t.Errorf("content digest %x, want %s", cd, v.ContentDigest)
				}
			}
			if v.EventIdentity != "" && e.EventIdentity() != v.EventIdentity {
				t.Errorf("event identity %s, want %s", e.EventIdentity(), v.EventIdentity)
			}
			if v.IdempotencyDigest != "" {
				id := e.IdempotencyDigest()
				if hex.EncodeToString(id[:]) != v.IdempotencyDigest {
					t.Errorf("idempotency digest %x, want %s", id, v.IdempotencyDigest)
				}
			}
			verr := e.Verify(pub)
			if v.ExpectValidSignature {
				if verr != nil {
					t.Fatalf("Verify: %v", verr)
				}
			} else {
				if r, ok := ReasonOf(verr); !ok || string(r) != v.ExpectReason {
					t.Fatalf("Verify = %v, want reason %s", verr, v.ExpectReason)
				}
				return
			}
			serr := e.Validate(vectorNow, 0)
			if v.ExpectReason == "" {
				if serr != nil {
					t.Fatalf("Validate: %v", serr)
				}
			} else if r, ok := ReasonOf(serr); !ok || string(r) != v.ExpectReason {
				t.Fatalf("Validate = %v, want reason %s", serr, v.ExpectReason)
			}
			// The stored form is the signing body with the signature put
			// back in canonical position, and it is itself canonical.
			c, err := Canonicalize([]byte(v.Body))
			if err != nil || !bytes.Equal(c, e.Canonical()) {
				t.Fatalf("Canonical() %q differs from Canonicalize(body) %q (%v)", e.Canonical(), c, err)
			}
			e2, err := Parse(e.Canonical())
			if err != nil || !bytes.Equal(e2.SigningInput(), e.SigningInput()) || !bytes.Equal(e2.Canonical(), e.Canonical()) {
				t.Fatalf("re-parse of canonical form is not stable: %v", err)
			}
		})
	}
}

func TestSharedVectorsBigIntegerStoredForm(t *testing.T) {
	vf := loadVectors(t)
	for _, v := range vf.Vectors {
		if v.Name != "big-integer" {
			continue
		}
		e, err := Parse([]byte(v.Body))
		if err != nil {
			t.Fatal(err)
		}
		if string(e.Payload) != `{"big":9007199254740992}` {
			t.Fatalf("payload %s", e.Payload)
		}
		if !bytes.Contains(e.Canonical(), []byte(`"payload":{"big":9007199254740992}`)) {
			t.Fatalf("canonical form keeps the raw number: %s", e.Canonical())
		}
		return
	}
	t.Fatal("big-integer vector missing")
}
