-- 0002: outbound side of controlplane/v1 (contract §4): webhook endpoints, the
-- outbound envelope streams, the signed envelopes and the leased outbox.
--
-- As in 0001, every primary key and unique index starts with tenant_id.

-- Service-owned webhook destinations. Deliveries go only to these rows, never
-- to an address taken from a producer's request. secret_ref names secrets in
-- the worker's configuration; no secret is stored here.
CREATE TABLE endpoints (
    tenant_id       text        NOT NULL,
    endpoint_id     text        NOT NULL,
    project_id      text        NOT NULL,
    topic           text        NOT NULL,
    url             text        NOT NULL CHECK (octet_length(url) BETWEEN 1 AND 2048),
    secret_ref      text        NOT NULL,
    state           text        NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'disabled')),
    disabled_reason text        NOT NULL DEFAULT '',
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, endpoint_id)
);
-- Enqueue fans out to the active endpoints of (tenant, project, topic).
CREATE INDEX endpoints_topic_idx ON endpoints (tenant_id, project_id, topic) WHERE state = 'active';

-- One row per outbound (tenant, project, producer) stream: the row is the
-- sequence lock. Kept apart from the inbound streams so outbound sequences
-- never show in the inbound read API and never move an inbound cursor.
CREATE TABLE outbound_streams (
    tenant_id     text        NOT NULL,
    project_id    text        NOT NULL,
    producer_id   text        NOT NULL,
    last_sequence bigint      NOT NULL CHECK (last_sequence BETWEEN 1 AND 9007199254740991),
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, project_id, producer_id)
);

-- The signed envelope of one enqueue, stored once however many endpoints it
-- fans out to, as the exact bytes every attempt sends. request_digest is the
-- SHA-256 of the request's JCS form: a repeat with the same idempotency key
-- must match it to get the original answer.
CREATE TABLE outbound_envelopes (
    tenant_id          text        NOT NULL,
    event_identity     bytea       NOT NULL CHECK (octet_length(event_identity) = 32),
    project_id         text        NOT NULL,
    producer_id        text        NOT NULL,
    sequence           bigint      NOT NULL CHECK (sequence BETWEEN 1 AND 9007199254740991),
    topic              text        NOT NULL,
    idempotency_digest bytea       NOT NULL CHECK (octet_length(idempotency_digest) = 32),
    request_digest     bytea       NOT NULL CHECK (octet_length(request_digest) = 32),
    envelope           bytea       NOT NULL,
    created_at         timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, event_identity)
);
CREATE UNIQUE INDEX outbound_envelopes_idempotency_idx
    ON outbound_envelopes (tenant_id, project_id, idempotency_digest);
CREATE UNIQUE INDEX outbound_envelopes_sequence_idx
    ON outbound_envelopes (tenant_id, project_id, producer_id, sequence);

-- One delivery of one envelope to one endpoint.
--
-- attempts counts claims and is the fencing token: every settle is
-- conditional on the attempt it claimed. next_attempt_at is when the message
-- is next due: the retry time while pending, the lease expiry while
-- delivering (an expired lease makes it claimable again), NULL once settled.
-- budget is the max_attempts of the request; a replay raises max_attempts to
-- attempts + budget.
CREATE TABLE outbox_messages (
    tenant_id        text        NOT NULL,
    message_id       text        NOT NULL,
    project_id       text        NOT NULL,
    topic            text        NOT NULL,
    endpoint_id      text        NOT NULL,
    event_identity   bytea       NOT NULL,
    status           text        NOT NULL DEFAULT 'pending'
                                 CHECK (status IN ('pending', 'delivering', 'delivered', 'dead')),
    attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    max_attempts     integer     NOT NULL CHECK (max_attempts >= 1),
    budget           integer     NOT NULL CHECK (budget BETWEEN 1 AND 50),
    lease_expiries   integer     NOT NULL DEFAULT 0 CHECK (lease_expiries >= 0),
    replays          integer     NOT NULL DEFAULT 0 CHECK (replays >= 0),
    next_attempt_at  timestamptz,
    lease_expires_at timestamptz,
    last_error_code  text        NOT NULL DEFAULT '',
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    delivered_at     timestamptz,
    dead_at          timestamptz,
    PRIMARY KEY (tenant_id, message_id),
    FOREIGN KEY (tenant_id, endpoint_id) REFERENCES endpoints (tenant_id, endpoint_id),
    FOREIGN KEY (tenant_id, event_identity) REFERENCES outbound_envelopes (tenant_id, event_identity),
    CHECK ((status IN ('pending', 'delivering')) = (next_attempt_at IS NOT NULL)),
    CHECK ((status = 'delivering') = (lease_expires_at IS NOT NULL)),
    CHECK ((status = 'delivered') = (delivered_at IS NOT NULL)),
    CHECK ((status = 'dead') = (dead_at IS NOT NULL))
);
-- Claim: the due messages of one tenant, oldest due first. message_id is in
-- the key so the claim's ORDER BY is the index order even when thousands of
-- messages share one next_attempt_at (a fan-out, a reset): the scan stops at
-- the LIMIT instead of sorting every due row.
CREATE INDEX outbox_messages_due_idx ON outbox_messages (tenant_id, next_attempt_at, message_id)
    WHERE status IN ('pending', 'delivering');
-- Dead-letter pages: (dead_at, message_id) is the cursor order.
CREATE INDEX outbox_messages_dead_idx ON outbox_messages (tenant_id, project_id, dead_at, message_id)
    WHERE status = 'dead';
-- A repeated enqueue answers with the envelope's message ids.
CREATE INDEX outbox_messages_envelope_idx ON outbox_messages (tenant_id, event_identity);

-- Least privilege. Column lists on UPDATE keep each role to the transitions it
-- owns: the worker settles attempts but cannot touch budgets, bodies or
-- destinations; enqueue and replay cannot rewrite the attempt counter.

-- delivery-worker: claim and settle messages, read destinations and bodies,
-- disable an endpoint that answered 410 Gone. Nothing inbound.
GRANT SELECT ON outbox_messages, endpoints, outbound_envelopes TO envelopeworker_delivery;
GRANT UPDATE (status, attempts, lease_expiries, next_attempt_at, lease_expires_at, last_error_code,
              delivered_at, dead_at, updated_at)
    ON outbox_messages TO envelopeworker_delivery;
GRANT UPDATE (state, disabled_reason, updated_at) ON endpoints TO envelopeworker_delivery;

-- ingest-api: enqueue (sequence, envelope, messages), read status and dead
-- letters, replay (audited through its existing INSERT on audit_events).
GRANT SELECT ON endpoints TO envelopeworker_ingest;
GRANT SELECT, INSERT, UPDATE ON outbound_streams TO envelopeworker_ingest;
GRANT SELECT, INSERT ON outbound_envelopes, outbox_messages TO envelopeworker_ingest;
GRANT UPDATE (status, max_attempts, replays, next_attempt_at, dead_at, updated_at)
    ON outbox_messages TO envelopeworker_ingest;

-- operators (envctl): manage endpoints, list and replay dead letters. A
-- replay writes an audit row, so operators may now append to the audit trail
-- (still never update or delete it).
GRANT SELECT, INSERT, UPDATE ON endpoints TO envelopeworker_operator;
-- Payload-bearing envelopes stay out of the operator's reach.
GRANT SELECT ON outbox_messages TO envelopeworker_operator;
GRANT UPDATE (status, max_attempts, replays, next_attempt_at, dead_at, updated_at)
    ON outbox_messages TO envelopeworker_operator;
GRANT INSERT ON audit_events TO envelopeworker_operator;
