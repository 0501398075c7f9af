-- 0005: least privilege, continued (issue 13): producer keys whose public key
-- and past never change, an ingest role that cannot read where webhooks go or
-- which secrets sign them, and secret refs that belong to one tenant.
--
-- Every statement may run again on a database that has it already (a
-- schema_migrations row removed by hand, an upgrade test): the objects are
-- replaced or kept, the backfill keeps the owners it finds.

-- Producer keys. The operator updates only a key's state and its two times
-- (retire, revoke); the guard below holds for every role, the owner included,
-- because a key whose bytes or history can be rewritten would let an old
-- signature verify as new. The contract's key states only move forward:
-- active -> retired -> revoked, active -> revoked; envctl has no un-retire
-- and revocation is final. A retirement or revocation time, once set, stays:
-- moving retired_at later would widen what a retired key still verifies.
REVOKE UPDATE ON producer_keys FROM envelopeworker_operator;
GRANT UPDATE (state, retired_at, revoked_at) ON producer_keys TO envelopeworker_operator;

-- SQLSTATE EW001 (class EW: envelopeworker's own) so the store can tell this
-- refusal from any other error.
CREATE OR REPLACE FUNCTION producer_keys_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.tenant_id <> OLD.tenant_id OR NEW.key_id <> OLD.key_id OR NEW.public_key <> OLD.public_key
       OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'a producer key''s identity and public key never change' USING ERRCODE = 'EW001';
    END IF;
    IF (OLD.state = 'revoked' AND NEW.state <> 'revoked') OR (OLD.state = 'retired' AND NEW.state = 'active') THEN
        RAISE EXCEPTION 'a producer key''s state moves only from active to retired to revoked' USING ERRCODE = 'EW001';
    END IF;
    IF (OLD.retired_at IS NOT NULL AND NEW.retired_at IS DISTINCT FROM OLD.retired_at)
       OR (OLD.revoked_at IS NOT NULL AND NEW.revoked_at IS DISTINCT FROM OLD.revoked_at) THEN
        RAISE EXCEPTION 'a producer key''s retirement and revocation times never move once set' USING ERRCODE = 'EW001';
    END IF;
    RETURN NEW;
END
$$;
REVOKE ALL ON FUNCTION producer_keys_guard() FROM PUBLIC;
DROP TRIGGER IF EXISTS producer_keys_guard ON producer_keys;
CREATE TRIGGER producer_keys_guard BEFORE UPDATE ON producer_keys
    FOR EACH ROW EXECUTE FUNCTION producer_keys_guard();

-- Endpoints as ingest-api sees them: enqueue fans out to the active endpoints
-- of (tenant, project, topic) and needs nothing else. URL and secret_ref stay
-- with the worker and the operator. (The outbox_messages foreign key is
-- checked as the table owner, so it needs no grant.)
REVOKE SELECT ON endpoints FROM envelopeworker_ingest;
GRANT SELECT (tenant_id, endpoint_id, project_id, topic, state) ON endpoints TO envelopeworker_ingest;

-- Secret refs belong to one tenant. A ref names secrets in the worker's
-- WEBHOOK_SECRETS_FILE; if two tenants' endpoints named the same ref, one
-- tenant's messages would be signed with the other's secret, and a receiver
-- of one would accept webhooks made for the other. The first tenant whose
-- endpoint names a ref owns it for good (an owner never moves: the secrets
-- behind the name are that tenant's). Refs are one namespace for the whole
-- database, so this key does not start with tenant_id.
--
-- tenant_id NULL: the ref was used by several tenants' endpoints before this
-- migration; it belongs to none of them, so no endpoint may take it and the
-- worker sends none of their messages, until an administrator gives it to one
-- tenant (docs/operations.md).
CREATE TABLE IF NOT EXISTS secret_ref_owners (
    secret_ref text        PRIMARY KEY,
    tenant_id  text,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Why a trigger on endpoints rather than a check in the store: every writer
-- obeys it (envctl of any version during a rolling upgrade, an operator's
-- psql session, a later endpoint update), and there is one home for the rule.
-- It is race-free: INSERT ... ON CONFLICT DO NOTHING waits for a concurrent
-- inserter of the same ref to commit or roll back, and the SELECT after it
-- (a new snapshot per statement under READ COMMITTED) then sees the winner,
-- so of two tenants adding one new ref at once exactly one owns it. Under
-- REPEATABLE READ the loser gets a serialization failure instead. SQLSTATE
-- EW002; the message never names the owner.
--
-- SECURITY DEFINER, so the operator needs no write grant on the owners table
-- (it could otherwise claim refs without an endpoint); the search_path is the
-- migrator's, pinned, so the function finds the table this file created
-- whatever the caller's search_path, and a caller cannot shadow it.
CREATE OR REPLACE FUNCTION endpoints_secret_ref_owner() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    owner text;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.secret_ref = OLD.secret_ref AND NEW.tenant_id = OLD.tenant_id THEN
        RETURN NULL;
    END IF;
    INSERT INTO secret_ref_owners (secret_ref, tenant_id) VALUES (NEW.secret_ref, NEW.tenant_id)
        ON CONFLICT (secret_ref) DO NOTHING;
    SELECT o.tenant_id INTO owner FROM secret_ref_owners o WHERE o.secret_ref = NEW.secret_ref;
    IF owner IS DISTINCT FROM NEW.tenant_id THEN
        RAISE EXCEPTION 'the secret ref belongs to another tenant' USING ERRCODE = 'EW002';
    END IF;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION endpoints_secret_ref_owner() FROM PUBLIC;

-- No endpoint may be written between the backfill and the trigger.
LOCK TABLE endpoints IN SHARE ROW EXCLUSIVE MODE;

INSERT INTO secret_ref_owners (secret_ref, tenant_id)
SELECT secret_ref, CASE WHEN min(tenant_id) = max(tenant_id) THEN min(tenant_id) END
FROM endpoints
GROUP BY secret_ref
ON CONFLICT (secret_ref) DO NOTHING;

-- AFTER, so a row that ON CONFLICT DO NOTHING skipped (a taken endpoint id)
-- claims nothing; an exception still undoes the whole statement.
DROP TRIGGER IF EXISTS endpoints_secret_ref_owner ON endpoints;
CREATE TRIGGER endpoints_secret_ref_owner AFTER INSERT OR UPDATE OF secret_ref, tenant_id ON endpoints
    FOR EACH ROW EXECUTE FUNCTION endpoints_secret_ref_owner();

DO $$
DECLARE
    n bigint;
BEGIN
    SELECT count(*) INTO n FROM secret_ref_owners WHERE tenant_id IS NULL;
    IF n > 0 THEN
        -- envctl migrate lists them; the worker refuses their messages.
        RAISE NOTICE 'secret refs: % are used by several tenants'' endpoints and belong to none', n;
    END IF;
END
$$;

-- The operator reads owners (envctl verify); it claims refs only through the
-- endpoints trigger, which runs as the migrator. The worker reads owners to refuse a message whose endpoint names a ref its
-- tenant does not own (one written past the trigger: a restore without
-- triggers, a hand edit). Nobody but the owner updates or deletes owners.
REVOKE INSERT ON secret_ref_owners FROM envelopeworker_operator;
GRANT SELECT ON secret_ref_owners TO envelopeworker_operator;
GRANT SELECT ON secret_ref_owners TO envelopeworker_delivery;
