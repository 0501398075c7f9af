package k8s

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestOverlaysRenderAndPass(t *testing.T) {
	dirs, err := overlayDirs()
	if err != nil {
		t.Fatal(err)
	}
	names := make([]string, 0, len(dirs))
	for _, d := range dirs {
		names = append(names, filepath.Base(d))
	}
	if strings.Join(names, ",") != "dev,prod" {
		t.Fatalf("overlays = %v, want dev and prod", names)
	}
	for _, dir := range dirs {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			objs, err := render(dir)
			if err != nil {
				t.Fatal(err)
			}
			kinds := map[string]int{}
			for _, o := range objs {
				kinds[o.Kind]++
			}
			want := map[string]int{"Deployment": 2, "Service": 1, "PodDisruptionBudget": 2, "HorizontalPodAutoscaler": 1,
				"CronJob": 2, "Job": 1, "NetworkPolicy": 5, "ServiceAccount": 4}
			if filepath.Base(dir) == "prod" { // components/monitoring
				want["PodMonitor"], want["ServiceMonitor"], want["PrometheusRule"], want["ConfigMap"] = 2, 1, 1, 1
			}
			for k, n := range want {
				if kinds[k] != n {
					t.Errorf("%d %s objects, want %d", kinds[k], k, n)
				}
			}
			if len(kinds) != len(want) {
				t.Errorf("kinds = %v, want exactly %v", kinds, want)
			}
			for _, v := range violations(objs) {
				t.Error(v)
			}
		})
	}
}

// Each testdata case breaks one rule on top of the real base; validation
// must catch it with the expected message.
func TestBrokenManifestsFail(t *testing.T) {
	cases := []struct {
		dir  string
		want []string // substrings of the render error, or of every violation, one each
	}{
		{"unknown-field", []string{`unknown field "readOnlyRootFS"`}},
		{"wrong-type", []string{"cannot unmarshal string"}},
		{"wrong-case", []string{`unknown field "spec.template.spec.securityContext.RunAsNonRoot"`}},
		{"broken-manifest", []string{"cannot unmarshal object"}},
		{"inline-secret", []string{"Secret/envelopeworker-ingest-database: secrets are referenced, never part of the manifests"}},
		{"inline-database-url", []string{
			"env DATABASE_URL must come from a secretKeyRef",
			"env DATABASE_URL carries URL credentials inline",
			"ingest-api: no workload with a DATABASE_URL secret reference",
		}},
		{"liveness-checks-database", []string{"liveness probe path /readyz, want /healthz"}},
		{"privilege-escalation", []string{"container retention-janitor: allowPrivilegeEscalation must be false"}},
		{"short-grace", []string{"terminationGracePeriodSeconds must exceed preStop 5s + SHUTDOWN_GRACE 25s"}},
		{"cronjob-allow", []string{`concurrencyPolicy "Allow", want Forbid`}},
		{"env-typo", []string{
			"env SYNC_LIMIT_TOKEN is not a setting of ingest-api",
			"env SYNC_LIMIT_TOKEN must come from a secretKeyRef", // TOKEN is a secret's word
			"env SYNC_LIMIT_TOKENS missing",
		}},
		{"shared-database-secret", []string{"DATABASE_URL secret envelopeworker-ingest-database shared with"}},
		{"metrics-open", []string{"ingest-api: unexpected ingress [TCP/9090]"}},
		{"migrate-unversioned", []string{`name must end with "-v0-2-0"`}},
		{"url-credentials", []string{"env PUSHGATEWAY_URL carries URL credentials inline"}},
		{"rollout-drops-old-pods", []string{"delivery-worker: a RollingUpdate with maxUnavailable 0 is required"}},
		{"rollout-deadline", []string{"ingest-api: progressDeadlineSeconds must exceed the migrate Job's activeDeadlineSeconds 600"}},
	}
	for _, tc := range cases {
		t.Run(tc.dir, func(t *testing.T) {
			objs, err := render(filepath.Join("testdata", tc.dir))
			if err != nil {
				if len(tc.want) != 1 || !strings.Contains(err.Error(), tc.want[0]) {
					t.Fatalf("render error %q, want one mentioning %q", err, tc.want)
				}
				t.Logf("refused: %v", err)
				return
			}
			// Exactly the expected violations: the base is otherwise clean,
			// and each rule reports its own breakage precisely.
			vs := violations(objs)
			wantViolations(t, vs, tc.want)
		})
	}
}

func TestRenderRefusesUnknownKind(t *testing.T) {
	_, err := render(filepath.Join("testdata", "unknown-kind"))
	if err == nil || !strings.Contains(err.Error(), "unexpected kind") {
		t.Fatalf("err = %v, want unexpected kind", err)
	}
}

// wantViolations fails unless vs holds exactly one violation mentioning each
// of want, and nothing else: a broken case must fire its own check and no
// other.
func wantViolations(t *testing.T, vs, want []string) {
	t.Helper()
	if len(vs) != len(want) {
		t.Fatalf("violations %q, want %d mentioning %q", vs, len(want), want)
	}
	for _, w := range want {
		i := slices.IndexFunc(vs, func(v string) bool { return strings.Contains(v, w) })
		if i < 0 {
			t.Fatalf("no violation mentions %q; got %q", w, vs)
		}
		t.Logf("refused: %s", vs[i])
		vs = slices.Delete(vs, i, i+1)
	}
}
