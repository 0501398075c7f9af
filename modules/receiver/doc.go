// Package receiver is the webhook-consumer side of envelopeworker: an
// http.Handler middleware that accepts a delivery only when it is what the
// delivery-worker sent, and hands the handler the verified controlplane/v1
// envelope — never an unverified one.
//
// A delivery must pass, in order: POST only; the three Standard Webhooks
// headers well formed; webhook-timestamp within Config.Tolerance; a body of
// at most 1 MiB; a v1 (HMAC-SHA256) or v1a (Ed25519) signature under one of
// Config.Secrets; a strict controlplane/v1 envelope; Config.Tenant's, when
// set; signed by one of the tenant's outbound keys (Config.Keys). The
// module's README lists each check with its answer and Code.
//
// Every refusal answers {"outcome":"refused","reason":"<Code>"} and never
// echoes request content. Any 4xx except 408, 410 and 429 makes the
// delivery-worker give the message up (a dead letter an operator can
// replay), which is what a misconfigured secret should look like.
//
// # Exactly once
//
// The worker redelivers until it sees a 2xx, so a receiver that crashed
// after its effect but before answering sees the same webhook-id again.
// Handler runs the effect inside a Receipts transaction that also records
// the webhook-id: a redelivery finds the receipt and answers 204 without
// running the effect. Package pgreceipts is the PostgreSQL implementation;
// it lives in its own package so that importing receiver builds no driver.
package receiver
