package envelope

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"math/big"
	"strings"
	"testing"

	"filippo.io/edwards25519"
)

func mustHex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// RFC 8032 section 7.1, TEST 1-3.
func TestRFC8032Vectors(t *testing.T) {
	cases := []struct{ name, secret, public, msg, sig string }{
		{"TEST 1",
			"9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
			"d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
			"",
			"e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b"},
		{"TEST 2",
			"4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
			"3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
			"72",
			"92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00"},
		{"TEST 3",
			"c5aa8df43f9f837bedb7442f31dcb7b166d38535076f094b85ce3a2e0b4458f7",
			"fc51cd8e6218a1a38da47ed00230f0580816ed13ba3303ac5deb911548908025",
			"af82",
			"6291d657deec24024827e69c3abe01a30ce548a284743a445e3680d7db5ac3ac18ff9b538d16f290ae67f760984dc6594a7c15e9716ed28dc027beceea1ec40a"},
	}
	for _, c := range cases {
		priv := ed25519.NewKeyFromSeed(mustHex(t, c.secret))
		pub := mustHex(t, c.public)
		msg := mustHex(t, c.msg)
		sig := mustHex(t, c.sig)
		if !bytes.Equal(priv.Public().(ed25519.PublicKey), pub) {
			t.Fatalf("%s: public key mismatch", c.name)
		}
		if err := ValidatePublicKey(pub); err != nil {
			t.Fatalf("%s: ValidatePublicKey: %v", c.name, err)
		}
		k, err := ParsePublicKey(base64.RawURLEncoding.EncodeToString(pub))
		if err != nil || !bytes.Equal(k, pub) {
			t.Fatalf("%s: ParsePublicKey: %v", c.name, err)
		}
		if got := ed25519.Sign(priv, msg); !bytes.Equal(got, sig) {
			t.Fatalf("%s: signature mismatch", c.name)
		}
		if !VerifySignature(pub, msg, sig) {
			t.Fatalf("%s: VerifySignature false", c.name)
		}
		bad := bytes.Clone(sig)
		bad[0] ^= 1
		if VerifySignature(pub, msg, bad) || VerifySignature(pub, append(bytes.Clone(msg), 0), sig) {
			t.Fatalf("%s: altered input verified", c.name)
		}
		if VerifySignature(pub[:31], msg, sig) || VerifySignature(pub, msg, sig[:63]) || VerifySignature(nil, msg, nil) {
			t.Fatalf("%s: wrong lengths verified", c.name)
		}
	}
}

// The eight points of small order in their canonical encodings, plus every
// non-canonical spelling of them (y >= p, or x = 0 with the sign bit set).
var smallOrderKeys = []string{
	"0100000000000000000000000000000000000000000000000000000000000000", // identity
	"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // order 2
	"0000000000000000000000000000000000000000000000000000000000000000", // order 4
	"0000000000000000000000000000000000000000000000000000000000000080", // order 4
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a", // order 8
	"c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa", // order 8
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05", // order 8
	"26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85", // order 8
	"0100000000000000000000000000000000000000000000000000000000000080", // identity, x=0 with sign
	"ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", // order 2, x=0 with sign
	"eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // identity, y = p+1
	"eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", // identity, y = p+1, sign
	"edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f", // order 4, y = p
	"edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff", // order 4, y = p, sign
}

func TestValidatePublicKeyRefusesSmallOrder(t *testing.T) {
	canonicalSmall := 0
	for _, h := range smallOrderKeys {
		k := mustHex(t, h)
		err := ValidatePublicKey(k)
		if !errors.Is(err, ErrInvalidPublicKey) {
			t.Errorf("%s accepted: %v", h, err)
		}
		if _, perr := ParsePublicKey(base64.RawURLEncoding.EncodeToString(k)); !errors.Is(perr, ErrInvalidPublicKey) {
			t.Errorf("ParsePublicKey(%s) accepted", h)
		}
		if p, err2 := new(edwards25519.Point).SetBytes(k); err2 == nil && bytes.Equal(p.Bytes(), k) {
			canonicalSmall++
			if !strings.Contains(err.Error(), "small-order") {
				t.Errorf("%s: %v, want the small-order refusal", h, err)
			}
		}
	}
	if canonicalSmall != 8 {
		t.Fatalf("%d canonical small-order points, want 8", canonicalSmall)
	}
}

// Every y in p..2^255-1 is a non-canonical spelling of y-p. Those that decode
// to a point of large order are refused for the encoding alone.
func TestValidatePublicKeyRefusesNonCanonical(t *testing.T) {
	p := new(big.Int).Sub(new(big.Int).Lsh(big.NewInt(1), 255), big.NewInt(19))
	largeOrder := 0
	for k := int64(0); k < 19; k++ {
		for _, sign := range []byte{0, 0x80} {
			y := new(big.Int).Add(p, big.NewInt(k))
			be := y.FillBytes(make([]byte, 32))
			enc := make([]byte, 32)
			for i := range be {
				enc[i] = be[31-i]
			}
			enc[31] |= sign
			err := ValidatePublicKey(enc)
			if !errors.Is(err, ErrInvalidPublicKey) {
				t.Fatalf("y=p+%d sign=%x accepted", k, sign)
			}
			pt, derr := new(edwards25519.Point).SetBytes(enc)
			if derr == nil && new(edwards25519.Point).MultByCofactor(pt).Equal(edwards25519.NewIdentityPoint()) == 0 {
				largeOrder++
				if !strings.Contains(err.Error(), "canonical") {
					t.Errorf("y=p+%d: %v, want the non-canonical refusal", k, err)
				}
			}
		}
	}
	if largeOrder == 0 {
		t.Fatal("no non-canonical large-order encoding exercised")
	}
}

func TestValidatePublicKeyShape(t *testing.T) {
	for _, n := range []int{0, 31, 33, 64} {
		if !errors.Is(ValidatePublicKey(make([]byte, n)), ErrInvalidPublicKey) {
			t.Errorf("%d bytes accepted", n)
		}
	}
	// Not on the curve: y = 2 has no x.
	noPoint := make([]byte, 32)
	noPoint[0] = 2
	if err := ValidatePublicKey(noPoint); !errors.Is(err, ErrInvalidPublicKey) {
		t.Errorf("off-curve accepted: %v", err)
	}
}

func TestParsePublicKey(t *testing.T) {
	const unpadded = "4V3FeYheeZOgtKfwbWMNoBdxvZJkfhWuxvn6a39ezW8" // the shared vectors' key
	want, _ := base64.RawURLEncoding.DecodeString(unpadded)
	for _, s := range []string{unpadded, unpadded + "="} {
		k, err := ParsePublicKey(s)
		if err != nil || !bytes.Equal(k, want) {
			t.Errorf("ParsePublicKey(%q) = %x, %v", s, k, err)
		}
	}
	bad := []string{
		"",
		unpadded + "==",
		unpadded[:42],
		unpadded + "A",
		unpadded[:20] + "\n" + unpadded[20:],
		unpadded[:20] + "+" + unpadded[21:],
		unpadded[:20] + "/" + unpadded[21:],
		unpadded[:42] + "9", // non-zero trailing bits
		"=" + unpadded,
		base64.RawURLEncoding.EncodeToString(make([]byte, 31)),
		base64.RawURLEncoding.EncodeToString(make([]byte, 33)),
	}
	for _, s := range bad {
		if _, err := ParsePublicKey(s); !errors.Is(err, ErrInvalidPublicKey) {
			t.Errorf("ParsePublicKey(%q) accepted: %v", s, err)
		}
	}
}
