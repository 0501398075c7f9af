package envelope

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha512"
	"hash"

	"filippo.io/edwards25519"
)

// The accept set (ZIP-215) is written down in the package doc, "Which
// signatures verify". Single and batch verification below implement the
// same set: a batch equation that holds implies, but for a 2^-128 chance,
// that each item's single equation holds, and the other way round, only
// because both equations are cofactored.

// verifyZIP215 is single verification under the ZIP-215 rules: A and R
// decoded with non-canonical encodings accepted, S canonical (< L), and the
// cofactored equation [8](S·B − k·A − R) = identity with k = SHA-512(R‖A‖M)
// mod L over the bytes as sent.
func verifyZIP215(pub, msg, sig []byte) bool {
	if len(pub) != ed25519.PublicKeySize || len(sig) != ed25519.SignatureSize {
		return false
	}
	var it sigItem
	if !it.decode(pub, sig) {
		return false
	}
	h := sha512.New()
	it.challenge(h, pub, sig, msg)
	minusA := new(edwards25519.Point).Negate(&it.a)
	// S·B − k·A, then minus R, times the cofactor.
	check := new(edwards25519.Point).VarTimeDoubleScalarBaseMult(&it.k, minusA, &it.s)
	check.Subtract(check, &it.r)
	check.MultByCofactor(check)
	return check.Equal(edwards25519.NewIdentityPoint()) == 1
}

// sigItem is one signature's decoded parts.
type sigItem struct {
	a, r edwards25519.Point
	s, k edwards25519.Scalar
}

// decode reads A, R and S; false when one of them is not a valid encoding
// (A or R not on the curve, S not below L). Lengths are the caller's check.
func (it *sigItem) decode(pub, sig []byte) bool {
	if _, err := it.a.SetBytes(pub); err != nil {
		return false
	}
	return it.decodeSig(sig)
}

// decodeSig reads R and S only: a batch decodes each distinct key once.
func (it *sigItem) decodeSig(sig []byte) bool {
	if _, err := it.r.SetBytes(sig[:32]); err != nil {
		return false
	}
	if _, err := it.s.SetCanonicalBytes(sig[32:]); err != nil {
		return false
	}
	return true
}

// challenge sets k = SHA-512(R‖A‖M) mod L, hashing the encodings as sent
// (a non-canonical R or A is hashed as written, as RFC 8032 signers do).
func (it *sigItem) challenge(h hash.Hash, pub, sig, msg []byte) {
	var digest [sha512.Size]byte
	h.Reset()
	h.Write(sig[:32])
	h.Write(pub)
	h.Write(msg)
	if _, err := it.k.SetUniformBytes(h.Sum(digest[:0])); err != nil {
		panic(err) // a SHA-512 digest is 64 bytes: cannot fail
	}
}

// BatchVerifier checks many Ed25519 signatures with one multi-scalar
// multiplication, under exactly the rules of VerifySignature. Add the items,
// then call Verify once. The zero value is ready to use; a BatchVerifier is
// not safe for concurrent use.
type BatchVerifier struct {
	items []batchEntry
}

type batchEntry struct {
	pub, msg, sig []byte
}

// NewBatchVerifier returns a verifier with room for n items.
func NewBatchVerifier(n int) *BatchVerifier {
	return &BatchVerifier{items: make([]batchEntry, 0, n)}
}

// Add queues one signature. The slices are read by Verify, not copied: the
// caller must not change them until Verify returns.
func (v *BatchVerifier) Add(pub ed25519.PublicKey, msg, sig []byte) {
	v.items = append(v.items, batchEntry{pub: pub, msg: msg, sig: sig})
}

// Len is the number of items added.
func (v *BatchVerifier) Len() int { return len(v.items) }

// Verify reports whether every item is a valid signature and, in the order
// they were added, each item's own verdict, which is always what
// VerifySignature would answer for it. Items that cannot be decoded (wrong
// lengths, a point not on the curve, S ≥ L) are refused on their own and
// kept out of the batch equation; when the equation over the rest fails,
// each of them is verified singly to find the bad ones.
func (v *BatchVerifier) Verify() (allValid bool, valid []bool) {
	valid = make([]bool, len(v.items))
	eq := v.prepare()
	if eq.len() == 0 {
		return eq.undecodable == 0, valid
	}
	z := make([]byte, 16*eq.len())
	rand.Read(z)
	if eq.holds(z) {
		for _, i := range eq.index {
			valid[i] = true
		}
		return eq.undecodable == 0, valid
	}
	allValid = eq.undecodable == 0
	for _, i := range eq.index {
		it := v.items[i]
		valid[i] = verifyZIP215(it.pub, it.msg, it.sig)
		allValid = allValid && valid[i]
	}
	return allValid, valid
}

// batchEquation holds the decoded items that take part in one check.
type batchEquation struct {
	sigs        []sigItem
	index       []int // the item each of sigs came from
	keys        []batchKey
	keyOf       []int // position in keys of each of sigs' A
	undecodable int
}

// batchKey is one distinct public key of the batch: a batch usually has
// one signing key, so it is decoded once, and the coefficients of its A
// terms add up, so its point enters the multi-scalar multiplication once.
type batchKey struct {
	enc []byte
	a   edwards25519.Point
}

func (e *batchEquation) len() int { return len(e.sigs) }

// prepare decodes every item and computes its challenge. Items that fail
// to decode are only counted: their verdict stays false.
func (v *BatchVerifier) prepare() *batchEquation {
	eq := &batchEquation{
		sigs:  make([]sigItem, 0, len(v.items)),
		index: make([]int, 0, len(v.items)),
		keyOf: make([]int, 0, len(v.items)),
	}
	h := sha512.New()
	for i, it := range v.items {
		if len(it.pub) != ed25519.PublicKeySize || len(it.sig) != ed25519.SignatureSize {
			eq.undecodable++
			continue
		}
		key, ok := eq.key(it.pub)
		eq.sigs = append(eq.sigs, sigItem{})
		s := &eq.sigs[len(eq.sigs)-1]
		if !ok || !s.decodeSig(it.sig) {
			eq.sigs = eq.sigs[:len(eq.sigs)-1]
			eq.undecodable++
			continue
		}
		s.challenge(h, it.pub, it.sig, it.msg)
		eq.index = append(eq.index, i)
		eq.keyOf = append(eq.keyOf, key)
	}
	return eq
}

// key returns the position of pub among the batch's distinct keys, decoding
// and adding it when new; false when pub is not a point. A linear scan: a
// batch holds at most MaxBatch items and usually one key.
func (e *batchEquation) key(pub []byte) (int, bool) {
	for j := range e.keys {
		if bytes.Equal(e.keys[j].enc, pub) {
			return j, true
		}
	}
	e.keys = append(e.keys, batchKey{enc: pub})
	if _, err := e.keys[len(e.keys)-1].a.SetBytes(pub); err != nil {
		e.keys = e.keys[:len(e.keys)-1]
		return 0, false
	}
	return len(e.keys) - 1, true
}

// holds checks, with z holding 16 random bytes per item (the 128-bit
// coefficients z_i),
//
//	[8]( −(Σ z_i·S_i)·B + Σ z_i·R_i + Σ_A (Σ_{i: A_i = A} z_i·k_i)·A ) = identity
//
// which is the sum of the items' single equations, each times z_i. A bad
// item makes it fail but with probability about 2^-128.
func (e *batchEquation) holds(z []byte) bool {
	n := len(e.sigs)
	scalars := make([]edwards25519.Scalar, 1+n+len(e.keys))
	scalarPtrs := make([]*edwards25519.Scalar, len(scalars))
	points := make([]*edwards25519.Point, len(scalars))
	for i := range scalars {
		scalarPtrs[i] = &scalars[i]
	}
	bCoeff := &scalars[0]
	points[0] = edwards25519.NewGeneratorPoint()
	aCoeffs := scalars[1+n:]
	for j := range e.keys {
		points[1+n+j] = &e.keys[j].a
	}
	var buf [32]byte
	for i := range e.sigs {
		s, zi := &e.sigs[i], &scalars[1+i]
		// Below 2^128 < L, so canonical.
		copy(buf[:16], z[16*i:16*i+16])
		if _, err := zi.SetCanonicalBytes(buf[:]); err != nil {
			panic(err) // 16 bytes of 32: cannot fail
		}
		bCoeff.MultiplyAdd(zi, &s.s, bCoeff)
		a := &aCoeffs[e.keyOf[i]]
		a.MultiplyAdd(zi, &s.k, a)
		points[1+i] = &s.r
	}
	bCoeff.Negate(bCoeff)
	check := new(edwards25519.Point).VarTimeMultiScalarMult(scalarPtrs, points)
	check.MultByCofactor(check)
	return check.Equal(edwards25519.NewIdentityPoint()) == 1
}
