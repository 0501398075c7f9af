-- 0009: the delivery statements look up their rows by key on empty, fresh
-- and large tables alike (issue 14), by 0006's method.
--
-- On a never-analyzed table PostgreSQL estimates one row for any equality on
-- tenant_id, and a partial index looks nearly empty (its size is estimated
-- from its own pages, and an equality in its predicate is taken to match one
-- row in 200), so a statement that implies a partial index's predicate finds
-- that index the cheapest way to any row of it. So every settle (its fence
-- says status = 'delivering', which implies the due index's status IN
-- ('pending', 'delivering')) updated its message through
-- outbox_messages_due_idx, reading the tenant's due set; a replay (status =
-- 'dead') read the tenant's dead letters through outbox_messages_dead_idx; a
-- message read or existence check went through outbox_messages_envelope_idx
-- (tenant_id leads it); the claim's endpoint join and the 410 settle's
-- endpoint update read the tenant's active endpoints through
-- endpoints_topic_idx (state = 'active'); and the fan-out's active-endpoint
-- list, which needs endpoint_id order for its LIMIT, took the primary key
-- (ordered, tenant_id only) on an empty table. A pooled connection keeps the
-- generic plans it made then until the table is first analyzed.
--
-- The fix, as in 0006: the primary key is the one index of these tables that
-- tenant_id leads, but the due index, whose tenant_id prefix is the claim's
-- per-tenant, oldest-first scan. Partial indexes keep only predicates their
-- own readers imply and the key lookups do not:
-- - outbox_messages_due_idx: next_attempt_at IS NOT NULL, the same rows (a
--   CHECK of 0002 ties next_attempt_at to the two due statuses), implied by
--   every reader of due work (next_attempt_at <= now()), by no settle.
-- - outbox_messages_dead_idx: dead_at IS NOT NULL, the same rows (CHECK),
--   led by project_id; the dead-letter list says dead_at IS NOT NULL, a
--   replay does not. A dead-letter list of the previous release does not
--   imply it either: until it is replaced it reads the tenant's messages by
--   the primary key (slower, the same answer).
-- - endpoints_topic_idx is no longer partial: state is a key column, and
--   endpoint_id last makes the fan-out's ORDER BY endpoint_id its index
--   order. Endpoints are few and rarely written.
-- TestHotStatementPlansUseTheirKeys (modules/store/plan_test.go) checks every
-- plan, custom and generic, on the three table states.
--
-- Names stay, and no index here is unique or an ON CONFLICT arbiter: a
-- release still running on this schema needs nothing of the old shapes. Each
-- build locks writes to its table while it reads the table (the migrator
-- runs each file in one transaction, where CREATE INDEX CONCURRENTLY cannot
-- run; docs/operations.md, Rolling upgrades). Every statement may run again:
-- the index is built anew.

DROP INDEX IF EXISTS outbox_messages_due_idx_0009;
CREATE INDEX outbox_messages_due_idx_0009 ON outbox_messages (tenant_id, next_attempt_at, message_id)
    WHERE next_attempt_at IS NOT NULL;
DROP INDEX outbox_messages_due_idx;
ALTER INDEX outbox_messages_due_idx_0009 RENAME TO outbox_messages_due_idx;

DROP INDEX IF EXISTS outbox_messages_dead_idx_0009;
CREATE INDEX outbox_messages_dead_idx_0009 ON outbox_messages (project_id, tenant_id, dead_at, message_id)
    WHERE dead_at IS NOT NULL;
DROP INDEX outbox_messages_dead_idx;
ALTER INDEX outbox_messages_dead_idx_0009 RENAME TO outbox_messages_dead_idx;

DROP INDEX IF EXISTS outbox_messages_envelope_idx_0009;
CREATE INDEX outbox_messages_envelope_idx_0009 ON outbox_messages (event_identity, tenant_id);
DROP INDEX outbox_messages_envelope_idx;
ALTER INDEX outbox_messages_envelope_idx_0009 RENAME TO outbox_messages_envelope_idx;

DROP INDEX IF EXISTS endpoints_topic_idx_0009;
CREATE INDEX endpoints_topic_idx_0009 ON endpoints (project_id, topic, tenant_id, state, endpoint_id);
DROP INDEX endpoints_topic_idx;
ALTER INDEX endpoints_topic_idx_0009 RENAME TO endpoints_topic_idx;
