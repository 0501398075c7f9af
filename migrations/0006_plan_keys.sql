-- 0006: every hot lookup has one index that matches it, on empty, fresh and
-- large tables alike (issue 14).
--
-- On a table never analyzed, PostgreSQL estimates one row for any equality
-- on tenant_id, so an index led by tenant_id alone costs exactly what the
-- unique index matching every column of the lookup costs; the tie goes to
-- the index created last (the planner keeps the first path of equal cost and
-- lists a table's indexes newest first). On outbound_envelopes the pair
-- (tenant_id, project_id) stays a tie until an ANALYZE, at any size. So the
-- idempotency lookup of an enqueue read the project's whole outbound history
-- through outbound_envelopes_sequence_idx, and the event, idempotency and
-- sequence lookups of an ingest read the tenant's identities through
-- event_identities_key_idx, until autovacuum first analyzed the table; and a
-- pooled connection keeps the generic plan it made on the empty table until
-- then.
--
-- The fix: the primary key is the one index of these tables that tenant_id
-- leads. Every other index leads with the column its lookups alone compare
-- (an idempotency digest, the project and producer of a stream, a key id),
-- so it cannot serve another lookup's tenant_id equality, and each is built
-- after the primary key, in the order below, so that where it does tie with
-- the primary key's tenant_id prefix (the table still empty) it wins. Every
-- unique index still holds tenant_id, which is what partitioning by tenant
-- needs. TestHotStatementPlansUseTheirKeys (modules/store/plan_test.go)
-- checks the plans, custom and generic, on all three table states.
--
-- The names, the uniqueness and so the ON CONFLICT and error handling of the
-- previous release stay: a release still running on this schema needs
-- nothing of the old column order. The migrator runs each file in one
-- transaction, where CREATE INDEX CONCURRENTLY cannot run: each build below
-- locks writes to its table while it reads the table (docs/operations.md,
-- Rolling upgrades). Every statement may run again (an upgrade test removes
-- the latest schema_migrations row): the index is built anew.

DROP INDEX IF EXISTS event_identities_key_idx_0006;
CREATE INDEX event_identities_key_idx_0006 ON event_identities (key_id, tenant_id, issued_at);
DROP INDEX event_identities_key_idx;
ALTER INDEX event_identities_key_idx_0006 RENAME TO event_identities_key_idx;

DROP INDEX IF EXISTS event_identities_sequence_idx_0006;
CREATE UNIQUE INDEX event_identities_sequence_idx_0006
    ON event_identities (project_id, producer_id, tenant_id, sequence);
DROP INDEX event_identities_sequence_idx;
ALTER INDEX event_identities_sequence_idx_0006 RENAME TO event_identities_sequence_idx;

DROP INDEX IF EXISTS event_identities_idempotency_idx_0006;
CREATE UNIQUE INDEX event_identities_idempotency_idx_0006 ON event_identities (idempotency_digest, tenant_id);
DROP INDEX event_identities_idempotency_idx;
ALTER INDEX event_identities_idempotency_idx_0006 RENAME TO event_identities_idempotency_idx;

DROP INDEX IF EXISTS outbound_envelopes_sequence_idx_0006;
CREATE UNIQUE INDEX outbound_envelopes_sequence_idx_0006
    ON outbound_envelopes (project_id, producer_id, tenant_id, sequence);
DROP INDEX outbound_envelopes_sequence_idx;
ALTER INDEX outbound_envelopes_sequence_idx_0006 RENAME TO outbound_envelopes_sequence_idx;

DROP INDEX IF EXISTS outbound_envelopes_idempotency_idx_0006;
CREATE UNIQUE INDEX outbound_envelopes_idempotency_idx_0006
    ON outbound_envelopes (idempotency_digest, tenant_id, project_id);
DROP INDEX outbound_envelopes_idempotency_idx;
ALTER INDEX outbound_envelopes_idempotency_idx_0006 RENAME TO outbound_envelopes_idempotency_idx;
