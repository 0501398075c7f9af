// Generates testdata/es6-numbers.txt.gz: one IEEE-754 double per line as
// "<16 hex digits of its bits> <String(number) in this JavaScript engine>".
// ECMAScript's Number::toString is the number format RFC 8785 prescribes, so
// this file is an independent oracle for the Go formatter.
//
// Deterministic: a fixed-seed splitmix64 drives every random choice and gzip
// writes no timestamp, so re-running it reproduces the checked-in file.
//
//   node testdata/gen-es6-numbers.js   (run from modules/envelope)
'use strict';
const fs = require('fs');
const zlib = require('zlib');
const path = require('path');

const MASK = (1n << 64n) - 1n;
let state = 0x5eed_0f_c0ffeen;
function next() {
  state = (state + 0x9e3779b97f4a7c15n) & MASK;
  let z = state;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & MASK;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & MASK;
  return z ^ (z >> 31n);
}

const buf = Buffer.alloc(8);
function fromBits(bits) { buf.writeBigUInt64BE(bits); return buf.readDoubleBE(0); }
function toBits(x) { buf.writeDoubleBE(x); return buf.readBigUInt64BE(0); }

const lines = [];
const seen = new Set();
function add(bits) {
  bits &= MASK;
  const x = fromBits(bits);
  if (!Number.isFinite(x)) return; // NaN and Infinity have no JSON form
  const key = bits.toString(16);
  if (seen.has(key)) return;
  seen.add(key);
  lines.push(bits.toString(16).padStart(16, '0') + ' ' + String(x));
}
function addNum(x) { add(toBits(x)); }
function around(x, n) { // x and its n nearest neighbours on each side
  const b = toBits(x);
  for (let d = -BigInt(n); d <= BigInt(n); d++) add(b + d);
}

// Edges.
addNum(0); addNum(-0);
add(1n); add(0x8000000000000001n);                     // smallest subnormals
add(0x000fffffffffffffn); add(0x800fffffffffffffn);    // largest subnormals
add(0x0010000000000000n); add(0x8010000000000000n);    // smallest normals
addNum(Number.MAX_VALUE); addNum(-Number.MAX_VALUE);
addNum(Number.MIN_VALUE); addNum(-Number.MIN_VALUE);
around(2 ** 53, 4); around(-(2 ** 53), 4);
around(1e21, 8); around(-1e21, 8);
around(1e-7, 8); around(1e-6, 8); around(-1e-7, 8); around(-1e-6, 8);
around(1e23, 4); around(1, 4); around(0.1, 4); around(5e-324, 4);
for (let e = -330; e <= 310; e++) { addNum(Number('1e' + e)); addNum(-Number('1e' + e)); }
for (let e = -1074; e <= 1023; e++) { addNum(2 ** e); }
// RFC 8785 appendix B.
for (const h of ['4340000000000000', 'c340000000000000', '4430000000000000',
  '44b52d02c7e14af5', '44b52d02c7e14af6', '44b52d02c7e14af7', '444b1ae4d6e2ef4e',
  '444b1ae4d6e2ef4f', '444b1ae4d6e2ef50', '3eb0c6f7a0b5ed8c', '3eb0c6f7a0b5ed8d',
  '41b3de4355555553', '41b3de4355555554', '41b3de4355555555', '41b3de4355555556',
  '41b3de4355555557', 'becbf647612f3696', '43143ff3c1cb0959']) add(BigInt('0x' + h));

// Uniformly random bit patterns: mostly exponent notation.
for (let i = 0; i < 70000; i++) add(next());
// Random mantissas with binary exponents around the plain-notation range
// (about 1e-9 .. 1e24) where the two notations meet.
for (let i = 0; i < 30000; i++) {
  const r = next();
  const exp = 1023n - 30n + (r >> 56n) % 110n;  // 2^-30 .. 2^79
  const sign = (r >> 55n) & 1n;
  add((sign << 63n) | (exp << 52n) | (next() & 0xfffffffffffffn));
}

const out = path.join(__dirname, 'es6-numbers.txt.gz');
fs.writeFileSync(out, zlib.gzipSync(lines.join('\n') + '\n', { level: 9 }));
console.error(`${lines.length} numbers written to ${out}`);
