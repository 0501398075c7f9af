// Package k8s holds the Kubernetes manifests of envelopeworker (a kustomize
// base and the dev and prod overlays) and, in its tests, their offline
// validation: every overlay is rendered with the kustomize API, every object
// is decoded strictly into its k8s.io/api type, and the deployment rules are
// checked on what would be applied.
//
// Layout: base/ holds the ingest-api and delivery-worker Deployments (with
// their probes, PodDisruptionBudgets, the ingest-api Service and
// HorizontalPodAutoscaler), the retention-janitor CronJob, the migration Job
// (envctl migrate; its name carries the release because a Job's pod template
// is immutable), NetworkPolicies (default deny plus one allow-list per
// binary) and one ServiceAccount per binary. overlays/dev and overlays/prod
// set namespace, replicas and resources. components/monitoring (used by prod)
// holds PodMonitors, a PrometheusRule with the alerts of docs/operations.md
// and the Grafana dashboard; monitoring_test.go checks them against the
// metrics the real binaries export.
//
// Secrets are referenced, never written here. Operators create, in the
// overlay's namespace:
//
//   - envelopeworker-ingest-database, envelopeworker-delivery-database,
//     envelopeworker-janitor-database, envelopeworker-migrate-database: key
//     DATABASE_URL, each for its own PostgreSQL role (envelopeworker_ingest,
//     envelopeworker_delivery, envelopeworker_janitor, and the schema owner
//     for migrations);
//   - envelopeworker-outbound-signing-keys: key keys.json, the
//     OUTBOUND_SIGNING_KEYS_FILE ({} when no tenant has an outbound
//     key: ingest-api checks the file at start);
//   - envelopeworker-webhook-secrets: key secrets.json, the
//     WEBHOOK_SECRETS_FILE.
//
// Files are mounted as directories rather than subPath so that rotated
// secrets reach running pods. The images are built from the Dockerfiles of
// each binary; the migration Job uses an envctl image.
package k8s
