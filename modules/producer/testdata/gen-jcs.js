// Regenerates jcs-expected.json with an RFC 8785 implementation independent
// of the Go one: JavaScript's own number serialization and UTF-16 key order.
// Run from this directory: node gen-jcs.js > jcs-expected.json
'use strict';
const crypto = require('crypto');
const fs = require('fs');

function jcs(v) {
  if (v === null || typeof v === 'boolean' || typeof v === 'number') return JSON.stringify(v);
  if (typeof v === 'string') return JSON.stringify(v);
  if (Array.isArray(v)) return '[' + v.map(jcs).join(',') + ']';
  // Array.prototype.sort compares strings by UTF-16 code units, as RFC 8785 requires.
  return '{' + Object.keys(v).sort().map(k => JSON.stringify(k) + ':' + jcs(v[k])).join(',') + '}';
}

const seed = Buffer.alloc(32, 7);
const key = crypto.createPrivateKey({
  key: Buffer.concat([Buffer.from('302e020100300506032b657004220420', 'hex'), seed]),
  format: 'der', type: 'pkcs8',
});
const cases = JSON.parse(fs.readFileSync('jcs-cases.json', 'utf8'));
const out = cases.map((c, i) => {
  const metadata = { kind: c.kind };
  if (c.correlation_id) metadata.correlation_id = c.correlation_id;
  if (c.traceparent) metadata.traceparent = c.traceparent;
  const env = {
    schema_version: 1, tenant_id: 'tenant-a', project_id: 'proj-1', producer_id: 'device-7',
    event_id: c.event_id, idempotency_key: c.event_id, key_id: 'k1', sequence: i + 1,
    issued_at: '2026-11-29T20:00:00.123Z', metadata, payload: JSON.parse(c.payload),
  };
  const input = 'controlplane/v1\n' + jcs(env);
  env.signature = crypto.sign(null, Buffer.from(input, 'utf8'), key).toString('base64url');
  return { event_id: c.event_id, body: jcs(env) };
});
process.stdout.write(JSON.stringify(out, null, 1) + '\n');
