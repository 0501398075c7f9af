package envelope

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"fmt"
	mrand "math/rand/v2"
	"testing"

	"filippo.io/edwards25519"
)

// order8Hex is a point of order 8 (one of the eight small-order points;
// TestTorsionPoint checks its order).
const order8Hex = "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a"

// orderL is the group order L, little-endian, for S+L.
var orderL = []byte{
	0xed, 0xd3, 0xf5, 0x5c, 0x1a, 0x63, 0x12, 0x58, 0xd6, 0x9c, 0xf7, 0xa2, 0xde, 0xf9, 0xde, 0x14,
	0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10,
}

func mustPoint(t testing.TB, enc []byte) *edwards25519.Point {
	t.Helper()
	p, err := new(edwards25519.Point).SetBytes(enc)
	if err != nil {
		t.Fatalf("%x is not a point: %v", enc, err)
	}
	return p
}

// secretScalar is the signing scalar a of an RFC 8032 key (A = a·B).
func secretScalar(t testing.TB, priv ed25519.PrivateKey) *edwards25519.Scalar {
	t.Helper()
	h := sha512.Sum512(priv.Seed())
	a, err := new(edwards25519.Scalar).SetBytesWithClamping(h[:32])
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// craftSig signs msg for the key encoded as pubEnc with an R chosen by the
// caller: R's encoding rEnc (possibly non-canonical, possibly of a point
// that is not r·B) and S = r + k·a, k = SHA-512(rEnc‖pubEnc‖msg). It is how
// a signer builds the edge cases the two rule sets disagree on.
func craftSig(t testing.TB, a *edwards25519.Scalar, pubEnc, rEnc []byte, r *edwards25519.Scalar, msg []byte) []byte {
	t.Helper()
	h := sha512.New()
	h.Write(rEnc)
	h.Write(pubEnc)
	h.Write(msg)
	k, err := new(edwards25519.Scalar).SetUniformBytes(h.Sum(nil))
	if err != nil {
		t.Fatal(err)
	}
	s := new(edwards25519.Scalar).MultiplyAdd(k, a, r)
	return append(append([]byte(nil), rEnc...), s.Bytes()...)
}

func addL(t testing.TB, sig []byte) []byte {
	t.Helper()
	out := append([]byte(nil), sig...)
	var carry uint16
	for i := range 32 {
		v := uint16(out[32+i]) + uint16(orderL[i]) + carry
		out[32+i], carry = byte(v), v>>8
	}
	if carry != 0 {
		t.Fatal("S+L overflows 32 bytes")
	}
	return out
}

func TestTorsionPoint(t *testing.T) {
	tp := mustPoint(t, mustHex(t, order8Hex))
	id := edwards25519.NewIdentityPoint()
	four := new(edwards25519.Point).Add(tp, tp)
	four.Add(four, four)
	if new(edwards25519.Point).MultByCofactor(tp).Equal(id) != 1 || four.Equal(id) == 1 {
		t.Fatal("order8Hex is not of order 8")
	}
}

type edgeCase struct {
	name           string
	pub, msg, sig  []byte
	zip215, stdlib bool
}

// edgeCases are the crafted signatures, written out, with what each rule
// set answers. Only a signer who builds them on purpose (knowing its own
// secret, or registering a small-order key, which ValidatePublicKey refuses)
// can make the first kind; RFC 8032 signing never does.
func edgeCases(t testing.TB) []edgeCase {
	t.Helper()
	priv := vectorKey(t)
	pub := []byte(priv.Public().(ed25519.PublicKey))
	a := secretScalar(t, priv)
	msg := []byte("controlplane/v1\nedge case")
	zero := edwards25519.NewScalar()
	r := mustScalar(t, 7)
	rB := new(edwards25519.Point).ScalarBaseMult(r)
	torsion := mustHex(t, order8Hex)
	identity := edwards25519.NewIdentityPoint().Bytes()
	// y = p+1: a non-canonical spelling of the identity.
	nonCanonicalIdentity := mustHex(t, "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f")
	// x = 0 with the sign bit set: the other non-canonical spelling.
	negZeroIdentity := append(append([]byte(nil), identity[:31]...), identity[31]|0x80)
	mixed := new(edwards25519.Point).Add(rB, mustPoint(t, torsion)).Bytes()

	valid := ed25519.Sign(priv, msg)
	return []edgeCase{
		{"RFC 8032 signature", pub, msg, valid, true, true},
		{"S+L", pub, msg, addL(t, valid), false, false},
		{"small-order R (order 8)", pub, msg, craftSig(t, a, pub, torsion, zero, msg), true, false},
		{"identity R", pub, msg, craftSig(t, a, pub, identity, zero, msg), true, true},
		{"mixed-order R (r·B + torsion)", pub, msg, craftSig(t, a, pub, mixed, r, msg), true, false},
		{"non-canonical R (identity as y = p+1)", pub, msg, craftSig(t, a, pub, nonCanonicalIdentity, zero, msg), true, false},
		{"non-canonical R (identity with x sign bit)", pub, msg, craftSig(t, a, pub, negZeroIdentity, zero, msg), true, false},
		{"small-order A (order 8)", torsion, msg, craftSig(t, zero, torsion, rB.Bytes(), r, msg), true, false},
		{"identity A", identity, msg, craftSig(t, zero, identity, rB.Bytes(), r, msg), true, true},
		{"non-canonical A (identity as y = p+1)", nonCanonicalIdentity, msg, craftSig(t, zero, nonCanonicalIdentity, rB.Bytes(), r, msg), true, true},
		{"small-order A, S+L", torsion, msg, addL(t, craftSig(t, zero, torsion, rB.Bytes(), r, msg)), false, false},
		{"R not on the curve", pub, msg, append(mustHex(t, "0200000000000000000000000000000000000000000000000000000000000000"), valid[32:]...), false, false},
	}
}

func mustScalar(t testing.TB, v byte) *edwards25519.Scalar {
	t.Helper()
	var b [32]byte
	b[0] = v
	s, err := new(edwards25519.Scalar).SetCanonicalBytes(b[:])
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestVerifyEdgeCases(t *testing.T) {
	// An honest signature next to each case, so the batch has a neighbour.
	priv := vectorKey(t)
	pub := priv.Public().(ed25519.PublicKey)
	other := []byte("controlplane/v1\nneighbour")
	otherSig := ed25519.Sign(priv, other)
	for _, c := range edgeCases(t) {
		t.Run(c.name, func(t *testing.T) {
			if got := VerifySignature(c.pub, c.msg, c.sig); got != c.zip215 {
				t.Errorf("VerifySignature = %v, want %v", got, c.zip215)
			}
			if got := ed25519.Verify(c.pub, c.msg, c.sig); got != c.stdlib {
				t.Errorf("crypto/ed25519.Verify = %v, want %v", got, c.stdlib)
			}
			for _, single := range []bool{true, false} {
				v := NewBatchVerifier(2)
				if !single {
					v.Add(pub, other, otherSig)
				}
				v.Add(c.pub, c.msg, c.sig)
				all, valid := v.Verify()
				if all != c.zip215 || valid[len(valid)-1] != c.zip215 || (!single && !valid[0]) {
					t.Errorf("batch (alone %v): all %v, verdicts %v; want %v", single, all, valid, c.zip215)
				}
				eq := v.prepare()
				decodable := eq.len() == v.Len()
				if decodable && eq.holds(randomZ(eq.len())) != c.zip215 {
					t.Errorf("batch equation (alone %v) disagrees with single verification", single)
				}
			}
		})
	}
}

func randomZ(n int) []byte {
	z := make([]byte, 16*n)
	rand.Read(z)
	return z
}

func TestVerifySharedVectorsBatchAndSingle(t *testing.T) {
	vf := loadVectors(t)
	pub, err := ParsePublicKey(vf.PublicKeyBase64URL)
	if err != nil {
		t.Fatal(err)
	}
	v := NewBatchVerifier(len(vf.Vectors))
	var want []bool
	for _, vec := range vf.Vectors {
		e, err := Parse([]byte(vec.Body))
		if err != nil {
			t.Fatalf("%s: %v", vec.Name, err)
		}
		single := VerifySignature(pub, e.SigningInput(), e.Signature)
		if single != vec.ExpectValidSignature {
			t.Errorf("%s: VerifySignature = %v, want %v", vec.Name, single, vec.ExpectValidSignature)
		}
		if std := ed25519.Verify(pub, e.SigningInput(), e.Signature); std != single {
			t.Errorf("%s: crypto/ed25519 says %v, VerifySignature %v", vec.Name, std, single)
		}
		v.Add(pub, e.SigningInput(), e.Signature)
		want = append(want, vec.ExpectValidSignature)
	}
	_, got := v.Verify()
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("%s: batch verdict %v, want %v", vf.Vectors[i].Name, got[i], want[i])
		}
	}
}

// corruption turns a valid (pub, msg, sig) into one that must not verify.
type corruption struct {
	name  string
	apply func(r *mrand.Rand, pub, msg, sig []byte, otherPub []byte) (p, m, s []byte)
}

func flipBit(r *mrand.Rand, b []byte, from, to int) []byte {
	out := append([]byte(nil), b...)
	i := from + r.IntN(to-from)
	out[i/8] ^= 1 << (i % 8)
	return out
}

func corruptions(t testing.TB) []corruption {
	return []corruption{
		{"msg bit", func(r *mrand.Rand, p, m, s, _ []byte) ([]byte, []byte, []byte) {
			if len(m) == 0 {
				return p, []byte{0}, s
			}
			return p, flipBit(r, m, 0, 8*len(m)), s
		}},
		{"R bit", func(r *mrand.Rand, p, m, s, _ []byte) ([]byte, []byte, []byte) { return p, m, flipBit(r, s, 0, 256) }},
		{"S bit", func(r *mrand.Rand, p, m, s, _ []byte) ([]byte, []byte, []byte) { return p, m, flipBit(r, s, 256, 512) }},
		{"key bit", func(r *mrand.Rand, p, m, s, _ []byte) ([]byte, []byte, []byte) { return flipBit(r, p, 0, 256), m, s }},
		{"S+L", func(_ *mrand.Rand, p, m, s, _ []byte) ([]byte, []byte, []byte) { return p, m, addL(t, s) }},
		{"wrong key", func(_ *mrand.Rand, _, m, s, o []byte) ([]byte, []byte, []byte) { return o, m, s }},
		{"short sig", func(_ *mrand.Rand, p, m, s, _ []byte) ([]byte, []byte, []byte) { return p, m, s[:63] }},
		{"short key", func(_ *mrand.Rand, p, m, s, _ []byte) ([]byte, []byte, []byte) { return p[:31], m, s }},
	}
}

func testKeys(t testing.TB, n int, r *mrand.Rand) []ed25519.PrivateKey {
	t.Helper()
	keys := make([]ed25519.PrivateKey, n)
	for i := range keys {
		var seed [ed25519.SeedSize]byte
		for j := range seed {
			seed[j] = byte(r.Uint32())
		}
		keys[i] = ed25519.NewKeyFromSeed(seed[:])
	}
	return keys
}

func randomMsg(r *mrand.Rand) []byte {
	m := make([]byte, r.IntN(300))
	for i := range m {
		m[i] = byte(r.Uint32())
	}
	return m
}

// stdlibVerify is crypto/ed25519.Verify without its length panic.
func stdlibVerify(pub, msg, sig []byte) bool {
	return len(pub) == ed25519.PublicKeySize && ed25519.Verify(pub, msg, sig)
}

// TestVerifyMatchesStdlib: on signatures made by RFC 8032 signing, and on
// every way of corrupting one, VerifySignature answers what
// crypto/ed25519.Verify answers. The two differ only on crafted signatures
// (TestVerifyEdgeCases).
func TestVerifyMatchesStdlib(t *testing.T) {
	r := mrand.New(mrand.NewPCG(1, 2))
	keys := testKeys(t, 8, r)
	corr := corruptions(t)
	counts := map[string]int{}
	for i := range 600 {
		priv, other := keys[i%len(keys)], keys[(i+1)%len(keys)]
		pub, otherPub := []byte(priv.Public().(ed25519.PublicKey)), []byte(other.Public().(ed25519.PublicKey))
		msg := randomMsg(r)
		sig := ed25519.Sign(priv, msg)
		if !VerifySignature(pub, msg, sig) || !ed25519.Verify(pub, msg, sig) {
			t.Fatalf("valid signature %d refused", i)
		}
		counts["valid"]++
		for _, c := range corr {
			p, m, s := c.apply(r, pub, msg, sig, otherPub)
			zip, std := VerifySignature(p, m, s), stdlibVerify(p, m, s)
			if zip != std {
				t.Fatalf("%s: VerifySignature %v, crypto/ed25519 %v (pub %x msg %x sig %x)", c.name, zip, std, p, m, s)
			}
			if zip {
				t.Fatalf("%s: corrupted signature accepted", c.name)
			}
			counts[c.name]++
		}
	}
	if len(counts) != len(corr)+1 {
		t.Fatalf("not every corruption ran: %v", counts)
	}
}

// batchPool is a mix of items with their single verdict: RFC 8032
// signatures over several keys, corrupted ones, and the crafted edge cases
// (some of which ZIP-215 accepts and crypto/ed25519 refuses: the batch must
// accept those too).
type poolItem struct {
	pub, msg, sig []byte
	valid         bool
}

func batchPool(t testing.TB, r *mrand.Rand) (good, bad []poolItem) {
	t.Helper()
	keys := testKeys(t, 3, r)
	many := testKeys(t, 100, r)
	corr := corruptions(t)
	for i := range 200 {
		priv := keys[i%len(keys)]
		if i%4 == 3 {
			priv = many[i%len(many)] // a distinct key per item too
		}
		pub := []byte(priv.Public().(ed25519.PublicKey))
		msg := randomMsg(r)
		sig := ed25519.Sign(priv, msg)
		good = append(good, poolItem{pub, msg, sig, true})
		c := corr[i%len(corr)]
		p, m, s := c.apply(r, pub, msg, sig, []byte(keys[(i+1)%len(keys)].Public().(ed25519.PublicKey)))
		bad = append(bad, poolItem{p, m, s, false})
	}
	for _, c := range edgeCases(t) {
		it := poolItem{c.pub, c.msg, c.sig, c.zip215}
		if c.zip215 {
			good = append(good, it)
		} else {
			bad = append(bad, it)
		}
	}
	for _, it := range append(append([]poolItem(nil), good...), bad...) {
		if VerifySignature(it.pub, it.msg, it.sig) != it.valid {
			t.Fatalf("pool item's single verdict is not %v", it.valid)
		}
	}
	return good, bad
}

// TestBatchMatchesSingle: for every batch size 1..MaxBatch, all-good
// batches and batches with bad items anywhere, the batch's verdicts are the
// single verdicts, and the batch equation itself (before any fallback)
// holds exactly when every decodable item is valid.
func TestBatchMatchesSingle(t *testing.T) {
	r := mrand.New(mrand.NewPCG(3, 4))
	good, bad := batchPool(t, r)
	for n := 1; n <= MaxBatch; n++ {
		for _, nBad := range []int{0, 1 + r.IntN(min(n, 3))} {
			items := make([]poolItem, n)
			for i := range items {
				items[i] = good[r.IntN(len(good))]
			}
			for _, i := range r.Perm(n)[:nBad] {
				items[i] = bad[r.IntN(len(bad))]
			}
			v := NewBatchVerifier(n)
			wantAll := true
			for _, it := range items {
				v.Add(it.pub, it.msg, it.sig)
				wantAll = wantAll && it.valid
			}
			name := fmt.Sprintf("size %d, %d bad", n, nBad)
			all, valid := v.Verify()
			if all != wantAll {
				t.Fatalf("%s: all %v, want %v", name, all, wantAll)
			}
			for i, it := range items {
				if valid[i] != it.valid {
					t.Fatalf("%s: item %d verdict %v, want %v", name, i, valid[i], it.valid)
				}
			}
			eq := v.prepare()
			decodableValid := true
			for _, i := range eq.index {
				decodableValid = decodableValid && items[i].valid
			}
			if got := eq.holds(randomZ(eq.len())); got != decodableValid {
				t.Fatalf("%s: equation holds %v, want %v", name, got, decodableValid)
			}
		}
	}
}

func TestBatchVerifierEmpty(t *testing.T) {
	var v BatchVerifier
	if all, valid := v.Verify(); !all || len(valid) != 0 {
		t.Fatalf("empty batch: %v %v", all, valid)
	}
}

// FuzzBatchVerify: for any (pub, msg, sig), single verification and the
// batch (the item between two honest signatures) agree; the batch equation
// before fallback agrees too; and whatever crypto/ed25519 accepts is
// accepted (ZIP-215 is a superset of it).
func FuzzBatchVerify(f *testing.F) {
	for _, c := range edgeCases(f) {
		f.Add(c.pub, c.msg, c.sig)
	}
	priv := vectorKey(f)
	pub := priv.Public().(ed25519.PublicKey)
	m1, m2 := []byte("controlplane/v1\nfirst"), []byte("controlplane/v1\nsecond")
	s1, s2 := ed25519.Sign(priv, m1), ed25519.Sign(priv, m2)
	f.Fuzz(func(t *testing.T, p, m, s []byte) {
		single := VerifySignature(p, m, s)
		if stdlibVerify(p, m, s) && !single {
			t.Fatalf("crypto/ed25519 accepts what VerifySignature refuses: pub %x msg %x sig %x", p, m, s)
		}
		v := NewBatchVerifier(3)
		v.Add(pub, m1, s1)
		v.Add(p, m, s)
		v.Add(pub, m2, s2)
		all, valid := v.Verify()
		if all != single || valid[1] != single || !valid[0] || !valid[2] {
			t.Fatalf("batch %v %v, single %v: pub %x msg %x sig %x", all, valid, single, p, m, s)
		}
		if eq := v.prepare(); eq.len() == 3 && eq.holds(randomZ(3)) != single {
			t.Fatalf("batch equation disagrees with single %v: pub %x msg %x sig %x", single, p, m, s)
		}
	})
}

// Guard against a test helper bug making the pools trivially agree.
func TestCraftSigMakesRFC8032Signatures(t *testing.T) {
	priv := vectorKey(t)
	pub := []byte(priv.Public().(ed25519.PublicKey))
	a := secretScalar(t, priv)
	r := mustScalar(t, 9)
	msg := []byte("m")
	sig := craftSig(t, a, pub, new(edwards25519.Point).ScalarBaseMult(r).Bytes(), r, msg)
	if !ed25519.Verify(pub, msg, sig) {
		t.Fatal("craftSig with R = r·B is not a valid signature")
	}
	if !bytes.Equal(new(edwards25519.Point).ScalarBaseMult(a).Bytes(), pub) {
		t.Fatal("secretScalar does not match the public key")
	}
}
