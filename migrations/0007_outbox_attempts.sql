-- 0007: delivery attempt history (contract §8.8).
--
-- One row per settled attempt of an outbox message: written by the
-- delivery-worker in the transaction that settles the attempt (delivered,
-- retry, dead), or by the claim that finds the attempt's lease expired
-- (lease_expired). The attempt number is the message's fencing counter, so
-- an attempt is recorded at most once: a stale worker's settle is fenced and
-- writes nothing. Only what an operator needs to explain a failure is kept:
-- never a response body, a header, a secret or a payload.
--
-- The primary key leads with tenant_id (the one tenant-led index, as 0006
-- requires) and serves the only read, a message's latest attempts.
-- Rows expire with the outbound envelope's body (§8.9).
CREATE TABLE IF NOT EXISTS outbox_attempts (
    tenant_id   text        NOT NULL,
    message_id  text        NOT NULL,
    attempt     integer     NOT NULL CHECK (attempt >= 1),
    started_at  timestamptz NOT NULL,
    duration_ms bigint      NOT NULL CHECK (duration_ms >= 0),
    http_status smallint    CHECK (http_status BETWEEN 100 AND 599),
    error_code  text        CHECK (error_code <> ''),
    result      text        NOT NULL CHECK (result IN ('delivered', 'retry', 'dead', 'lease_expired')),
    PRIMARY KEY (tenant_id, message_id, attempt)
);

-- delivery-worker: records attempts; reads none back.
GRANT INSERT ON outbox_attempts TO envelopeworker_delivery;
-- ingest-api (GET /v1/outbox/{id}/attempts) and operators (envctl outbox attempts).
GRANT SELECT ON outbox_attempts TO envelopeworker_ingest, envelopeworker_operator;
