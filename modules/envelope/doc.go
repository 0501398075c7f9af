// Package envelope owns the controlplane/v1 envelope format: reading it,
// canonicalizing it, checking it, deriving its identities and signing it.
// It has no state and no I/O; the key store, the replay floor, streams and
// audit live elsewhere and call in here.
//
// # What it owns
//
//   - A strict JSON reader (Canonicalize, CanonicalizeWithLimits) that
//     enforces the contract's document limits while it reads and writes the
//     RFC 8785 (JCS) form in the same pass.
//   - The envelope's step 2 (Parse): structure, member types and bounded
//     identities; step 3 (Envelope.Verify, or BatchVerifier for many at
//     once): the Ed25519 signature over the signing input; step 4
//     (Envelope.Validate): schema version, the closed metadata object and
//     the issued_at window. Every refusal is an *Error carrying the
//     contract's stable Reason.
//   - The derived values the store keys on: SigningInput, ContentDigest,
//     EventIdentity, IdempotencyDigest, and Canonical, the only form that is
//     ever stored, served or delivered.
//   - Building and signing outbound envelopes (Sign), registration checks
//     for device keys (ValidatePublicKey, ParsePublicKey) and splitting batch
//     bodies (SplitBatch).
//
// # Which signatures verify
//
// The contract says Ed25519 and RFC 8032, whose verification rules leave
// room: implementations differ on non-canonical point encodings, on
// small-order components and on whether the check is cofactored. Where it
// is silent, VerifySignature, Envelope.Verify and BatchVerifier accept
// exactly the ZIP-215 set:
//
//   - S must be canonical (S < L);
//   - A and R are decoded with non-canonical encodings accepted (y ≥ p, or
//     x = 0 with the sign bit set), and hashed as sent;
//   - the check is cofactored: [8](S·B − k·A − R) = identity, with
//     k = SHA-512(R‖A‖M) mod L.
//
// The cofactored equation is what makes one accept set possible for single
// and batch checks: a batch sums the items' equations times random 128-bit
// coefficients, and only with the cofactor does a passing sum imply (but
// for a 2^-128 chance) that every item passes on its own. BatchVerifier
// falls back to single checks when a batch fails, so every item gets its own
// verdict, which is always VerifySignature's.
//
// Every signature made by RFC 8032 signing is accepted by both ZIP-215 and
// crypto/ed25519's cofactorless rules (and everything crypto/ed25519
// accepts, ZIP-215 accepts). They differ only on signatures a signer
// crafted on purpose, with a small-order or mixed-order R or a
// non-canonical R encoding (accepted here, refused by crypto/ed25519), or
// under a small-order key, which ValidatePublicKey refuses at registration.
// Making one takes the signer's own secret key, so it can only affect that
// signer's own envelopes: it does not let anyone forge for another key.
package envelope

// Design notes. They are kept here, beside the code, rather than in the
// package documentation, which says what the package owns and how to call it.
//
// # Why the reader is strict
//
// A signature binds bytes, so every ambiguity in reading JSON is a way for
// two parties to disagree about what was signed. encoding/json is built for
// convenience instead: it lets the last of two duplicate members win, matches
// member names case-insensitively, replaces invalid UTF-8 and lone surrogates
// with U+FFFD, and decodes into a tree before any limit can apply. Each of
// those would let an envelope mean one thing to a checker and another to a
// consumer, so this reader refuses, as invalid_envelope:
//
//   - duplicate member names anywhere in the document, compared after
//     unescaping ("a" and "\u0061" are the same name);
//   - invalid UTF-8 (including overlong forms and encoded surrogates), lone
//     or mis-ordered surrogate escapes, raw control characters in strings;
//   - numbers whose magnitude exceeds the largest finite double (1e400);
//     tiny numbers round as IEEE-754 and ECMAScript's JSON.parse do (1e-400
//     reads as 0);
//   - anything outside RFC 8259's grammar: leading zeros, '+', NaN, comments,
//     trailing commas, a byte order mark, a second top-level value;
//   - more than Limits.MaxBytes (body_too_large), nesting deeper than
//     MaxDepth, more than MaxItems array elements plus object members over
//     the whole document. Depth and items are checked as containers open and
//     items are counted, before the rest of the document is looked at.
//
// Member names are case-sensitive: "Sequence" is an unknown member, not the
// sequence. Integers required by the contract (schema_version, sequence)
// must be written without fraction or exponent: 1.0 and 1e0 are refused.
//
// # Canonical form
//
// RFC 8785 exactly: members sorted by their UTF-16 code units, no
// insignificant white space, strings with only the mandatory escapes (\" \\,
// \b \f \n \r \t and \u00xx for other control characters; everything else as
// raw UTF-8), numbers in ECMAScript's Number.prototype.toString form (-0 is
// 0; 9007199254740993 becomes 9007199254740992). The signing input is
// SigningPrefix followed by the canonical envelope without its signature
// member; the stored form is the canonical envelope with it.
//
// # Decisions where the contract is silent
//
//   - Limits.Tighten treats zero or negative fields as "keep"; the public
//     entry points always tighten the contract's defaults, so no option can
//     loosen or disable a limit.
//   - issued_at is YYYY-MM-DDTHH:MM:SS[.digits]Z with upper-case T and Z
//     and calendar-valid fields; offsets other than Z and leap seconds (:60)
//     are refused. RFC 3339 bounds no fraction, so any number of fraction
//     digits is read; digits past nanoseconds are dropped (the signature covers
//     the string as sent, so nothing is lost).
//   - signature must be exactly 86 base64url characters with zero trailing
//     bits, so one signature has one spelling.
//   - Parse fills Envelope.Metadata only when the metadata object will pass
//     step 4; it is judged at parse time but reported by Validate, keeping
//     the contract's order of steps.
//   - Validate's bounds are inclusive (exactly 5 minutes ahead, or exactly
//     the replay window old, passes); a window <= 0 means 90 days.
//   - Verify does not revalidate the key's point encoding: that is done once,
//     at registration, by ValidatePublicKey. A key of the wrong length is an
//     error wrapping ErrInvalidPublicKey, not bad_signature, because it is
//     the receiver's fault, not the sender's.
//   - Sign applies step 2 only, so tests can build envelopes that receivers
//     refuse at step 4. It refuses a zero IssuedAt and an empty payload.
//   - SplitBatch checks the wrapper strictly and the items only for JSON
//     grammar; each item's limits, UTF-8, duplicates and envelope rules are
//     applied when the caller parses it, so one bad item does not sink the
//     batch.
//   - Error details are fixed sentences (details.go, KnownDetails) naming a
//     rule and the contract member it concerns (contract §8.11); they never
//     echo request content or say where a body broke, so they are safe in
//     logs and answers.
