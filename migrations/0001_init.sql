-- 0001: inbound side of controlplane/v1 (contract §1–§3, §5).
--
-- Every primary key and unique index starts with tenant_id so the tables can be
-- partitioned by tenant later without rewriting keys. schema_migrations (created
-- by the migrator) is the one table that is not tenant data.

-- Opaque bearer credentials. Only the SHA-256 digest of the token is stored; the
-- lookup by digest is a plain index because the token carries no tenant.
CREATE TABLE credentials (
    tenant_id     text        NOT NULL,
    credential_id text        NOT NULL,
    token_digest  bytea       NOT NULL CHECK (octet_length(token_digest) = 32),
    account_id    text        NOT NULL,
    device_id     text        NOT NULL,
    role          text        NOT NULL CHECK (role IN ('device', 'service', 'operator')),
    status        text        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'revoked')),
    created_at    timestamptz NOT NULL DEFAULT now(),
    revoked_at    timestamptz,
    PRIMARY KEY (tenant_id, credential_id)
);
CREATE INDEX credentials_token_digest_idx ON credentials (token_digest);

-- Producer (device) Ed25519 public keys, scoped by tenant.
CREATE TABLE producer_keys (
    tenant_id  text        NOT NULL,
    key_id     text        NOT NULL,
    public_key bytea       NOT NULL CHECK (octet_length(public_key) = 32),
    state      text        NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'retired', 'revoked')),
    created_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz,
    revoked_at timestamptz,
    PRIMARY KEY (tenant_id, key_id),
    CHECK ((state = 'retired') <= (retired_at IS NOT NULL)),
    CHECK ((state = 'revoked') <= (revoked_at IS NOT NULL))
);

-- One row per (tenant, project, producer) stream. The row is the stream lock:
-- ingest upserts it FOR UPDATE before deciding anything. cursor >= replay_floor
-- always holds (SetReplayFloor advances the cursor when it raises the floor).
CREATE TABLE streams (
    tenant_id    text        NOT NULL,
    project_id   text        NOT NULL,
    producer_id  text        NOT NULL,
    cursor       bigint      NOT NULL DEFAULT 0 CHECK (cursor >= 0),
    replay_floor bigint      NOT NULL DEFAULT 0 CHECK (replay_floor >= 0),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, project_id, producer_id),
    CHECK (cursor >= replay_floor)
);

-- Permanent event identities: never deleted, so an envelope sent again after its
-- payload expired is still recognised (duplicate / conflict). event_identity and
-- idempotency_digest already hash tenant and project in (contract §1), so they
-- are unique per tenant.
CREATE TABLE event_identities (
    tenant_id          text        NOT NULL,
    event_identity     bytea       NOT NULL CHECK (octet_length(event_identity) = 32),
    project_id         text        NOT NULL,
    producer_id        text        NOT NULL,
    sequence           bigint      NOT NULL CHECK (sequence BETWEEN 1 AND 9007199254740991),
    idempotency_digest bytea       NOT NULL CHECK (octet_length(idempotency_digest) = 32),
    content_digest     bytea       NOT NULL CHECK (octet_length(content_digest) = 32),
    key_id             text        NOT NULL,
    issued_at          timestamptz NOT NULL,
    received_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, event_identity)
);
CREATE UNIQUE INDEX event_identities_idempotency_idx
    ON event_identities (tenant_id, idempotency_digest);
CREATE UNIQUE INDEX event_identities_sequence_idx
    ON event_identities (tenant_id, project_id, producer_id, sequence);
-- Key pruning asks "did this key sign anything newer than the replay window?".
CREATE INDEX event_identities_key_idx
    ON event_identities (tenant_id, key_id, issued_at);

-- Expiring inbound payloads: the canonical (JCS) signed envelope exactly as
-- verified, stored as bytes so nothing re-encodes it. The janitor deletes rows
-- here and nowhere else.
CREATE TABLE inbound_payloads (
    tenant_id      text        NOT NULL,
    event_identity bytea       NOT NULL,
    envelope       bytea       NOT NULL,
    expires_at     timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, event_identity),
    FOREIGN KEY (tenant_id, event_identity) REFERENCES event_identities (tenant_id, event_identity)
);
CREATE INDEX inbound_payloads_expires_at_idx ON inbound_payloads (expires_at);

-- Audit trail (contract §3). Never a credential, signature, idempotency key or
-- payload. Empty string means "not known".
CREATE TABLE audit_events (
    tenant_id      text        NOT NULL,
    audit_id       bigint      GENERATED ALWAYS AS IDENTITY,
    project_id     text        NOT NULL DEFAULT '',
    account_id     text        NOT NULL DEFAULT '',
    device_id      text        NOT NULL DEFAULT '',
    event_identity text        NOT NULL DEFAULT '',
    outcome        text        NOT NULL,
    reason         text        NOT NULL DEFAULT '',
    correlation_id text        NOT NULL DEFAULT '',
    at             timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, audit_id)
);

-- Least privilege. Roles are cluster-wide and many databases may migrate at the
-- same time, so creation tolerates a concurrent creator; grants are per database.
-- LOGIN without password: operators set passwords or certificates.
DO $$
DECLARE
    r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['envelopeworker_ingest', 'envelopeworker_delivery',
                             'envelopeworker_janitor', 'envelopeworker_operator'] LOOP
        BEGIN
            EXECUTE format('CREATE ROLE %I LOGIN', r);
        EXCEPTION WHEN duplicate_object OR unique_violation THEN
            NULL;
        END;
    END LOOP;
END
$$;

REVOKE ALL ON ALL TABLES IN SCHEMA public FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
GRANT USAGE ON SCHEMA public TO envelopeworker_ingest, envelopeworker_delivery,
    envelopeworker_janitor, envelopeworker_operator;

-- Readiness: every binary compares the applied version with the one it expects.
GRANT SELECT ON schema_migrations TO envelopeworker_ingest, envelopeworker_delivery,
    envelopeworker_janitor, envelopeworker_operator;

-- ingest-api: authenticate, resolve keys, sequence and commit envelopes, read
-- streams, append audit rows. It never deletes, and never writes keys or credentials.
GRANT SELECT ON credentials, producer_keys TO envelopeworker_ingest;
GRANT SELECT, INSERT, UPDATE ON streams TO envelopeworker_ingest;
GRANT SELECT, INSERT ON event_identities, inbound_payloads TO envelopeworker_ingest;
GRANT INSERT ON audit_events TO envelopeworker_ingest;

-- retention-janitor: select and delete payload rows, nothing else.
GRANT SELECT, DELETE ON inbound_payloads TO envelopeworker_janitor;

-- delivery-worker: nothing inbound; the outbox migrations grant what it needs.

-- operators (envctl): manage credentials, keys (prune deletes), replay floors;
-- read audit and identities. Never delete identities, payloads or audit rows.
GRANT SELECT, INSERT, UPDATE ON credentials TO envelopeworker_operator;
GRANT SELECT, INSERT, UPDATE, DELETE ON producer_keys TO envelopeworker_operator;
GRANT SELECT, INSERT, UPDATE ON streams TO envelopeworker_operator;
GRANT SELECT ON event_identities, audit_events TO envelopeworker_operator;
