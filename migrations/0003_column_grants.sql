-- UPDATE narrowed to the columns each role's statements write, so a role can
-- not change what its job never changes: ingest cannot move a replay floor or
-- rename a stream, the operator cannot rewrite a credential's token digest,
-- identity or role, nor an endpoint's URL or secret reference. Revoking the
-- table-level privilege also revokes every column's, so the grants follow it.

-- ingest: stream locks (ON CONFLICT ... SET cursor) and cursor advances;
-- outbound sequence allocation.
REVOKE UPDATE ON streams, outbound_streams FROM envelopeworker_ingest;
GRANT UPDATE (cursor, updated_at) ON streams TO envelopeworker_ingest;
GRANT UPDATE (last_sequence, updated_at) ON outbound_streams TO envelopeworker_ingest;

-- operator: credential revocation, replay floors (which advance the cursor),
-- endpoint enable/disable.
REVOKE UPDATE ON credentials, streams, endpoints FROM envelopeworker_operator;
GRANT UPDATE (status, revoked_at) ON credentials TO envelopeworker_operator;
GRANT UPDATE (cursor, replay_floor, updated_at) ON streams TO envelopeworker_operator;
GRANT UPDATE (state, disabled_reason, updated_at) ON endpoints TO envelopeworker_operator;
