-- 0011: which tenants have due work, read as an index scan (issue 18).
--
-- Until now the worker's round grouped every due message by tenant and
-- sorted the groups: its cost grew with the backlog (2.5 s at 1 M due). This
-- table keeps one row per tenant that ever had an outbox message, with due_at
-- a lower bound of the next_attempt_at of every message of the tenant that
-- is pending or delivering on an active endpoint ('infinity' when there is
-- none). The round reads outbox_due_tenants_due_idx from its start up to
-- now() and stops at its LIMIT: its cost depends on neither the backlog nor
-- the tenants with nothing due. The order is the old one, oldest due first,
-- so no tenant waits behind tenants that became due after it.
--
-- Who writes due_at:
-- - Lowering, in the statement that makes a message due sooner, by the
--   triggers below (so every writer obeys it: ingest-api's enqueue, the
--   worker's retry settle, a replay, envctl endpoint enable, an operator's
--   psql session, a release that predates this file): an insert, an update
--   of next_attempt_at to an earlier time or from NULL (retry before the
--   lease ran out, replay, a lease shortened by hand), and an endpoint made
--   active again (down to the tenant's earliest message).
-- - Raising, only by the worker's claim (modules/store/outbox_claim.go), in
--   its transaction: it locks the row FOR UPDATE SKIP LOCKED and only then,
--   in a later statement (a fresh snapshot), sets the exact value. A stale
--   low value costs one claim that finds nothing; a value too high would
--   hide due work, so the raise must see every message a lowering writer
--   meant to cover.
--
-- Why that is race-free: a lowering writer takes FOR KEY SHARE on the row
-- before it compares (statements of its own, in the writer's transaction,
-- each with a fresh snapshot under READ COMMITTED), and holds it until it
-- commits. A raise that finds the row so held skips the raise (the row
-- stays low: the tenant is listed again). A raise that holds the row first
-- makes the writer wait, and the writer then compares with the raised
-- value and lowers it. A raise that comes after the writer committed sees
-- the writer's messages in its fresh snapshot. Writers do not wait for one
-- another (KEY SHARE does not conflict with KEY SHARE or with the NO KEY
-- UPDATE of a lowering), except two that lower one tenant at once: the
-- second waits for the first to commit and then finds nothing to lower; and
-- the raise never waits. So a busy tenant's enqueues are not serialized by
-- this row, and a claim never stalls behind them.
--
-- The table is cross-tenant and small (one row per tenant), so both layouts
-- keep it as one heap (like endpoints). The functions are SECURITY DEFINER
-- with the migrator's search_path pinned, as in 0005: no role needs a grant
-- on the table to lower it; the worker reads it and raises due_at.

CREATE TABLE IF NOT EXISTS outbox_due_tenants (
    tenant_id text        PRIMARY KEY,
    due_at    timestamptz NOT NULL
);
-- The round: due_at <= now() in due_at order, tenant_id breaking ties.
CREATE INDEX IF NOT EXISTS outbox_due_tenants_due_idx ON outbox_due_tenants (due_at, tenant_id);

-- outbox_due_tenants_lower makes due_at at most due for tenant, creating the
-- row on the tenant's first message. KEY SHARE first, then the comparison
-- (see above for the order).
CREATE OR REPLACE FUNCTION outbox_due_tenants_lower(tenant text, due timestamptz) RETURNS void LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO outbox_due_tenants (tenant_id, due_at) VALUES (tenant, due) ON CONFLICT (tenant_id) DO NOTHING;
    PERFORM FROM outbox_due_tenants d WHERE d.tenant_id = tenant FOR KEY SHARE;
    UPDATE outbox_due_tenants d SET due_at = due WHERE d.tenant_id = tenant AND d.due_at > due;
END
$$;
REVOKE ALL ON FUNCTION outbox_due_tenants_lower(text, timestamptz) FROM PUBLIC;

-- Inserted messages, once per statement (a fan-out or a batch enqueue is one
-- call per tenant, not one per message), tenants in key order so two
-- multi-tenant inserts lock rows in the same order.
CREATE OR REPLACE FUNCTION outbox_messages_due_inserted() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    r record;
BEGIN
    FOR r IN SELECT n.tenant_id, min(n.next_attempt_at) AS due FROM inserted n
             WHERE n.next_attempt_at IS NOT NULL GROUP BY n.tenant_id ORDER BY n.tenant_id LOOP
        PERFORM outbox_due_tenants_lower(r.tenant_id, r.due);
    END LOOP;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox_messages_due_inserted() FROM PUBLIC;

-- A message due sooner than before: the trigger's WHEN keeps claims (the
-- lease is later), delivered and dead settles (NULL) from calling it.
CREATE OR REPLACE FUNCTION outbox_messages_due_sooner() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    PERFORM outbox_due_tenants_lower(NEW.tenant_id, NEW.next_attempt_at);
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox_messages_due_sooner() FROM PUBLIC;

-- An endpoint active again: its messages waited in place, and the raise
-- counts active endpoints only, so lower to the tenant's earliest message
-- (the first entry of its range of the due index; a lower bound of the
-- endpoint's).
CREATE OR REPLACE FUNCTION endpoints_due_enabled() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    due timestamptz;
BEGIN
    SELECT m.next_attempt_at INTO due FROM outbox_messages m
    WHERE m.tenant_id = NEW.tenant_id AND m.next_attempt_at IS NOT NULL
    ORDER BY m.next_attempt_at LIMIT 1;
    IF due IS NOT NULL THEN
        PERFORM outbox_due_tenants_lower(NEW.tenant_id, due);
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION endpoints_due_enabled() FROM PUBLIC;

-- No message or endpoint may be written between the backfill and the
-- triggers (the migrator runs this file in one transaction).
LOCK TABLE outbox_messages, endpoints IN SHARE ROW EXCLUSIVE MODE;

DROP TRIGGER IF EXISTS outbox_messages_due_inserted ON outbox_messages;
CREATE TRIGGER outbox_messages_due_inserted AFTER INSERT ON outbox_messages
    REFERENCING NEW TABLE AS inserted FOR EACH STATEMENT EXECUTE FUNCTION outbox_messages_due_inserted();
DROP TRIGGER IF EXISTS outbox_messages_due_sooner ON outbox_messages;
CREATE TRIGGER outbox_messages_due_sooner AFTER UPDATE OF next_attempt_at ON outbox_messages
    FOR EACH ROW WHEN (NEW.next_attempt_at < OLD.next_attempt_at
                       OR (OLD.next_attempt_at IS NULL AND NEW.next_attempt_at IS NOT NULL))
    EXECUTE FUNCTION outbox_messages_due_sooner();
DROP TRIGGER IF EXISTS endpoints_due_enabled ON endpoints;
CREATE TRIGGER endpoints_due_enabled AFTER UPDATE OF state ON endpoints
    FOR EACH ROW WHEN (NEW.state = 'active' AND OLD.state IS DISTINCT FROM 'active')
    EXECUTE FUNCTION endpoints_due_enabled();

-- Backfill: each tenant's earliest pending or delivering message, whatever
-- its endpoint's state (a lower bound; the first claim sets the exact value).
-- Tenants whose messages are all settled get no row until their next one.
INSERT INTO outbox_due_tenants (tenant_id, due_at)
SELECT m.tenant_id, min(m.next_attempt_at) FROM outbox_messages m
WHERE m.next_attempt_at IS NOT NULL
GROUP BY m.tenant_id
ON CONFLICT (tenant_id) DO UPDATE SET due_at = least(outbox_due_tenants.due_at, excluded.due_at);

-- delivery-worker: the round reads it; the claim raises due_at (UPDATE, and
-- FOR UPDATE, which needs it). Nobody else reads or writes it but through
-- the functions above.
GRANT SELECT ON outbox_due_tenants TO envelopeworker_delivery;
GRANT UPDATE (due_at) ON outbox_due_tenants TO envelopeworker_delivery;
