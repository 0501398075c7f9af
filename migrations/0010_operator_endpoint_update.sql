-- 0010: envctl endpoint update (issue 16) moves an endpoint to a new URL or
-- secret ref, e.g. when a receiver changes host or its secrets are renamed.
-- 0003 kept both columns from the operator because nothing then changed them;
-- the endpoint's identity (tenant, project, topic) stays out of reach. A new
-- secret ref is still claimed through the owners trigger of 0005, which runs
-- on UPDATE OF secret_ref, so a ref of another tenant is refused as on add.
-- GRANT is idempotent, so the file re-runs cleanly.
GRANT UPDATE (url, secret_ref) ON endpoints TO envelopeworker_operator;
