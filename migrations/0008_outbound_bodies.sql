-- 0008: outbound retention (contract §8.9), the expand step.
--
-- The outbound envelope is split like the inbound one: its identity
-- (outbound_envelopes: sequence, idempotency and request digests) stays for
-- good, so a repeated enqueue is still recognised after the body expired;
-- the body (the exact signed bytes every attempt sends) moves to
-- outbound_bodies, which the retention-janitor empties.
--
-- expires_at is NULL while the body may still be sent. Every settle that
-- leaves a message delivered or dead raises it to at least that settle's
-- now() + OUTBOX_PAYLOAD_RETENTION, so once the envelope's last message
-- settled it holds the last settle's time plus the retention; a replay sets
-- it back to NULL. The janitor deletes a body only when it is past
-- expires_at AND none of the envelope's messages is pending or delivering:
-- that check, not the settles, decides "the last message settled", so two
-- messages settling at once in separate transactions need not see each
-- other (docs/retention-janitor.md).
--
-- Expand/contract (docs/operations.md, Rolling upgrades): this release
-- writes bodies only here and reads here first, then the old column;
-- outbound_envelopes.envelope becomes nullable so `envctl outbox
-- backfill-bodies` can move old bodies in batches and clear the column. A
-- later release drops the column. Every statement may run again (the
-- upgrade test re-applies the latest migration).
CREATE TABLE IF NOT EXISTS outbound_bodies (
    tenant_id      text        NOT NULL,
    event_identity bytea       NOT NULL,
    envelope       bytea       NOT NULL,
    expires_at     timestamptz,
    PRIMARY KEY (tenant_id, event_identity),
    FOREIGN KEY (tenant_id, event_identity) REFERENCES outbound_envelopes (tenant_id, event_identity)
);
-- The janitor's scan, oldest expiry first; bodies still in use are not in it.
CREATE INDEX IF NOT EXISTS outbound_bodies_expires_at_idx ON outbound_bodies (expires_at)
    WHERE expires_at IS NOT NULL;

ALTER TABLE outbound_envelopes ALTER COLUMN envelope DROP NOT NULL;

-- Which envelopes still hold their body in the old column: a replay by an
-- operator must tell "not moved yet" from "expired" without reading any
-- body, and the operator may not select outbound_envelopes. The view runs
-- with its owner's rights and shows keys only.
CREATE OR REPLACE VIEW outbound_unmoved_bodies AS
    SELECT tenant_id, event_identity FROM outbound_envelopes WHERE envelope IS NOT NULL;

-- ingest-api: enqueue writes bodies; repeats and status read them; a replay
-- clears the expiry.
GRANT SELECT, INSERT ON outbound_bodies TO envelopeworker_ingest;
GRANT UPDATE (expires_at) ON outbound_bodies TO envelopeworker_ingest;
GRANT SELECT ON outbound_unmoved_bodies TO envelopeworker_ingest;

-- delivery-worker: reads bodies to send them; a settle sets the expiry.
GRANT SELECT ON outbound_bodies TO envelopeworker_delivery;
GRANT UPDATE (expires_at) ON outbound_bodies TO envelopeworker_delivery;

-- operators (envctl dlq replay): clear the expiry; never read a body.
GRANT SELECT (tenant_id, event_identity, expires_at), UPDATE (expires_at) ON outbound_bodies
    TO envelopeworker_operator;
GRANT SELECT ON outbound_unmoved_bodies TO envelopeworker_operator;

-- retention-janitor: delete expired bodies and their messages' attempt rows;
-- read which messages are still in flight. Nothing else.
GRANT SELECT, DELETE ON outbound_bodies, outbox_attempts TO envelopeworker_janitor;
GRANT SELECT (tenant_id, message_id, event_identity, status) ON outbox_messages TO envelopeworker_janitor;
