package k8s

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// object is one rendered manifest decoded into its k8s.io/api type.
type object struct {
	APIVersion, Kind, Name, Namespace string
	Obj                               any
}

func (o object) String() string { return o.Kind + "/" + o.Name }

// newTyped maps apiVersion and kind to the type the API server would decode
// into. Anything else is refused: a manifest of an unexpected kind is not
// validated, so it must not slip through.
func newTyped(apiVersion, kind string) (any, error) {
	switch apiVersion + " " + kind {
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, nil
	case "v1 Service":
		return &corev1.Service{}, nil
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, nil
	case "v1 Secret":
		return &corev1.Secret{}, nil
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, nil
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, nil
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, nil
	case "batch/v1 CronJob":
		return &batchv1.CronJob{}, nil
	case "batch/v1 Job":
		return &batchv1.Job{}, nil
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, nil
	case "monitoring.coreos.com/v1 PodMonitor":
		return &monitoringv1.PodMonitor{}, nil
	case "monitoring.coreos.com/v1 ServiceMonitor":
		return &monitoringv1.ServiceMonitor{}, nil
	case "monitoring.coreos.com/v1 PrometheusRule":
		return &monitoringv1.PrometheusRule{}, nil
	}
	return nil, fmt.Errorf("unexpected kind %s %s", apiVersion, kind)
}

// render builds the kustomization in dir from disk, offline, and decodes
// every object strictly: an unknown field, a field of the wrong type, a
// duplicate key or a wrongly cased name is an error.
func render(dir string) ([]object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize %s: %w", dir, err)
	}
	var out []object
	for _, r := range m.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		j, err := yaml.YAMLToJSONStrict(y)
		if err != nil {
			return nil, fmt.Errorf("%s: yaml: %w", r.CurId(), err)
		}
		typed, err := newTyped(r.GetApiVersion(), r.GetKind())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", r.CurId(), err)
		}
		dec := json.NewDecoder(bytes.NewReader(j))
		dec.DisallowUnknownFields()
		if err := dec.Decode(typed); err != nil {
			return nil, fmt.Errorf("%s %s: decode: %w", r.GetKind(), r.GetName(), err)
		}
		// encoding/json matches names case-insensitively; the API server
		// does not. sigs.k8s.io/json is the server's strict decoder.
		strict, err := sigsjson.UnmarshalStrict(j, typed, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
		if err != nil {
			return nil, fmt.Errorf("%s %s: decode: %w", r.GetKind(), r.GetName(), err)
		}
		if len(strict) > 0 {
			return nil, fmt.Errorf("%s %s: strict decode: %v", r.GetKind(), r.GetName(), strict)
		}
		out = append(out, object{APIVersion: r.GetApiVersion(), Kind: r.GetKind(), Name: r.GetName(), Namespace: r.GetNamespace(), Obj: typed})
	}
	return out, nil
}

// Env names each binary reads: contract §6 plus the binaries' own settings.
// An env entry outside its binary's list is a typo the binary would ignore.
var knownEnv = map[string][]string{
	"ingest-api": {"DATABASE_URL", "INGEST_ADDR", "METRICS_ADDR", "OUTBOUND_SIGNING_KEYS_FILE", "PAYLOAD_RETENTION",
		"SYNC_LIMIT_TOKENS", "SYNC_LIMIT_INTERVAL", "PEER_LIMIT_TOKENS", "PEER_LIMIT_INTERVAL",
		"OUTBOX_LIMIT_TOKENS", "OUTBOX_LIMIT_INTERVAL", "TRUSTED_PROXIES",
		"SHUTDOWN_GRACE", "LOG_LEVEL", "REPLAY_WINDOW", "MAX_SEQUENCE_AHEAD", "STORE_TIMEOUT", "DB_MAX_OPEN_CONNS",
		"CREDENTIAL_CACHE_TTL", "GROUP_COMMIT_WINDOW", "GROUP_COMMIT_MAX_ITEMS", "GROUP_COMMIT_CONCURRENCY",
		"INGEST_MAX_INFLIGHT_BODY_BYTES",
		"GOMEMLIMIT"}, // read by the Go runtime
	"delivery-worker": {"DATABASE_URL", "METRICS_ADDR", "WEBHOOK_SECRETS_FILE", "DELIVERY_LEASE", "DELIVERY_BACKOFF_BASE",
		"DELIVERY_BACKOFF_MAX", "DELIVERY_HTTP_TIMEOUT", "DELIVERY_ALLOW_INSECURE_LOOPBACK",
		"SHUTDOWN_GRACE", "LOG_LEVEL", "DELIVERY_CONCURRENCY", "DELIVERY_TENANT_MAX_INFLIGHT", "DELIVERY_CLAIM_SIZE", "DELIVERY_POLL_INTERVAL",
		"DELIVERY_LIMIT_TOKENS", "DELIVERY_LIMIT_INTERVAL", "SECRETS_RELOAD_INTERVAL", "STORE_TIMEOUT", "DB_MAX_OPEN_CONNS",
		"OUTBOX_PAYLOAD_RETENTION"},
	"retention-janitor": {"DATABASE_URL", "JANITOR_TIMEOUT", "JANITOR_BATCH_SIZE", "JANITOR_MAX_ROWS_PER_SECOND", "JANITOR_WAL_COMPRESSION", "PUSHGATEWAY_URL", "PUSHGATEWAY_TIMEOUT", "LOG_LEVEL"},
	"migrate":           {"DATABASE_URL"},
}

// Env names each binary must be given explicitly (contract §6).
var requiredEnv = map[string][]string{
	"ingest-api": {"DATABASE_URL", "INGEST_ADDR", "METRICS_ADDR", "OUTBOUND_SIGNING_KEYS_FILE", "PAYLOAD_RETENTION",
		"SYNC_LIMIT_TOKENS", "SYNC_LIMIT_INTERVAL", "PEER_LIMIT_TOKENS", "PEER_LIMIT_INTERVAL"},
	"delivery-worker": {"DATABASE_URL", "METRICS_ADDR", "WEBHOOK_SECRETS_FILE", "DELIVERY_LEASE", "DELIVERY_BACKOFF_BASE",
		"DELIVERY_BACKOFF_MAX", "DELIVERY_HTTP_TIMEOUT", "OUTBOX_PAYLOAD_RETENTION"},
	"retention-janitor": {"DATABASE_URL", "JANITOR_TIMEOUT"},
	"migrate":           {"DATABASE_URL"},
}

// File settings that must point into a mounted Secret volume.
var secretFileEnv = map[string]string{
	"OUTBOUND_SIGNING_KEYS_FILE": "ingest-api",
	"WEBHOOK_SECRETS_FILE":       "delivery-worker",
}

// Binaries' defaults for the durations the checks compare with.
const (
	defaultShutdownGrace  = 25 * time.Second
	defaultJanitorTimeout = 10 * time.Minute
)

// workload is one pod template with where it came from.
type workload struct {
	owner  string // Kind/name
	binary string // app.kubernetes.io/name
	spec   corev1.PodSpec
}

func workloads(objs []object) []workload {
	var out []workload
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *appsv1.Deployment:
			out = append(out, workload{o.String(), v.Spec.Template.Labels["app.kubernetes.io/name"], v.Spec.Template.Spec})
		case *batchv1.CronJob:
			t := v.Spec.JobTemplate.Spec.Template
			out = append(out, workload{o.String(), t.Labels["app.kubernetes.io/name"], t.Spec})
		case *batchv1.Job:
			out = append(out, workload{o.String(), v.Spec.Template.Labels["app.kubernetes.io/name"], v.Spec.Template.Spec})
		}
	}
	return out
}

// violations lists every rule the rendered objects break; empty means the
// overlay may be applied.
func violations(objs []object) []string {
	var bad []string
	fail := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }

	byKind := map[string][]object{}
	for _, o := range objs {
		byKind[o.Kind] = append(byKind[o.Kind], o)
		if o.Kind != "Namespace" && o.Namespace == "" {
			fail("%s: no namespace", o)
		}
	}
	for _, o := range byKind["Secret"] {
		fail("%s: secrets are referenced, never part of the manifests", o)
	}
	for _, o := range byKind["ConfigMap"] {
		// The one ConfigMap: Grafana dashboards, found by the sidecar's label.
		cm := o.Obj.(*corev1.ConfigMap)
		if cm.Labels["grafana_dashboard"] != "1" {
			fail("%s: unexpected ConfigMap (settings live in env, secrets in Secrets)", o)
			continue
		}
		for k, v := range cm.Data {
			if !strings.HasSuffix(k, ".json") || !json.Valid([]byte(v)) {
				fail("%s: %s is not a JSON dashboard", o, k)
			}
		}
	}

	dbSecrets := map[string]string{}
	for _, w := range workloads(objs) {
		bad = append(bad, checkPod(w, dbSecrets)...)
	}
	for _, want := range []string{"ingest-api", "delivery-worker", "retention-janitor", "migrate"} {
		if _, ok := dbSecrets[want]; !ok {
			fail("%s: no workload with a DATABASE_URL secret reference", want)
		}
	}

	bad = append(bad, checkDeployments(byKind)...)
	bad = append(bad, checkJobs(byKind)...)
	bad = append(bad, checkNetworkPolicies(byKind)...)
	return bad
}

func checkPod(w workload, dbSecrets map[string]string) []string {
	var bad []string
	fail := func(format string, a ...any) { bad = append(bad, w.owner+": "+fmt.Sprintf(format, a...)) }
	p := w.spec
	if w.binary == "" {
		fail("pod template has no app.kubernetes.io/name label")
	}
	if p.AutomountServiceAccountToken == nil || *p.AutomountServiceAccountToken {
		fail("automountServiceAccountToken must be false")
	}
	if p.ServiceAccountName == "" || p.ServiceAccountName == "default" {
		fail("runs as the default service account")
	}
	if p.HostNetwork || p.HostPID || p.HostIPC {
		fail("uses a host namespace")
	}
	psc := p.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot {
		fail("pod securityContext.runAsNonRoot must be true")
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		fail("pod seccompProfile must be RuntimeDefault")
	}
	if psc != nil && psc.RunAsUser != nil && *psc.RunAsUser == 0 {
		fail("pod runs as uid 0")
	}
	secretVolumes := map[string]bool{}
	for _, v := range p.Volumes {
		switch {
		case v.Secret != nil:
			secretVolumes[v.Name] = true
		case v.HostPath != nil:
			fail("volume %s is a hostPath", v.Name)
		}
	}
	containers := append(append([]corev1.Container{}, p.InitContainers...), p.Containers...)
	if len(p.Containers) == 0 {
		fail("no containers")
	}
	for _, c := range containers {
		cfail := func(format string, a ...any) { fail("container %s: %s", c.Name, fmt.Sprintf(format, a...)) }
		sc := c.SecurityContext
		if sc == nil {
			cfail("no securityContext")
			continue
		}
		if sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			cfail("runAsNonRoot must be true")
		}
		if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
			cfail("runs as uid 0")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			cfail("readOnlyRootFilesystem must be true")
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			cfail("allowPrivilegeEscalation must be false")
		}
		if sc.Privileged != nil && *sc.Privileged {
			cfail("privileged")
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			cfail("capabilities must drop ALL")
		} else if len(sc.Capabilities.Add) > 0 {
			cfail("adds capabilities %v", sc.Capabilities.Add)
		}
		if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
			cfail("seccompProfile must be RuntimeDefault")
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			req, okReq := c.Resources.Requests[r]
			lim, okLim := c.Resources.Limits[r]
			if !okReq || !okLim {
				cfail("resources.requests and limits must both set %s", r)
			} else if req.Cmp(lim) > 0 {
				cfail("%s request %s above limit %s", r, req.String(), lim.String())
			}
		}
		if c.Image == "" || !strings.Contains(path.Base(c.Image), ":") || strings.HasSuffix(c.Image, ":latest") {
			cfail("image %q must carry a release tag", c.Image)
		}
		if len(c.EnvFrom) > 0 {
			cfail("envFrom hides which settings a binary gets; list env entries")
		}
		env := map[string]corev1.EnvVar{}
		for _, e := range c.Env {
			if _, dup := env[e.Name]; dup {
				cfail("env %s set twice", e.Name)
			}
			env[e.Name] = e
			if !slices.Contains(knownEnv[w.binary], e.Name) {
				cfail("env %s is not a setting of %s", e.Name, w.binary)
			}
			if looksSecret(e.Name) && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
				cfail("env %s must come from a secretKeyRef, never a value", e.Name)
			}
			if u, err := url.Parse(e.Value); err == nil && u.User != nil {
				cfail("env %s carries URL credentials inline", e.Name)
			}
			if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil && e.ValueFrom.SecretKeyRef.Name == "" {
				cfail("env %s references a secret without a name", e.Name)
			}
		}
		for _, name := range requiredEnv[w.binary] {
			if _, ok := env[name]; !ok {
				cfail("env %s missing", name)
			}
		}
		if e, ok := env["DATABASE_URL"]; ok && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			ref := e.ValueFrom.SecretKeyRef.Name
			for other, otherRef := range dbSecrets {
				if other != w.binary && otherRef == ref {
					cfail("DATABASE_URL secret %s shared with %s: each binary has its own role", ref, other)
				}
			}
			dbSecrets[w.binary] = ref
		}
		for name := range secretFileEnv {
			e, ok := env[name]
			if !ok {
				continue
			}
			if !mountedFromSecret(c, secretVolumes, e.Value) {
				cfail("env %s=%q is not a file in a mounted Secret volume", name, e.Value)
			}
		}
	}
	return bad
}

// looksSecret says whether a setting would carry a credential if set inline.
func looksSecret(name string) bool {
	if name == "DATABASE_URL" {
		return true
	}
	if strings.HasSuffix(name, "_FILE") {
		return false
	}
	// Whole words: SYNC_LIMIT_TOKENS is a rate, not a token.
	for _, w := range strings.Split(name, "_") {
		switch w {
		case "PASSWORD", "SECRET", "SECRETS", "TOKEN", "SEED", "PRIVATE", "CREDENTIAL", "DSN":
			return true
		}
	}
	return false
}

func mountedFromSecret(c corev1.Container, secretVolumes map[string]bool, file string) bool {
	if !path.IsAbs(file) {
		return false
	}
	for _, m := range c.VolumeMounts {
		if secretVolumes[m.Name] && m.ReadOnly && strings.HasPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/") {
			return true
		}
	}
	return false
}

func envDuration(c corev1.Container, name string, def time.Duration) (time.Duration, error) {
	for _, e := range c.Env {
		if e.Name == name {
			return time.ParseDuration(e.Value)
		}
	}
	return def, nil
}

func checkDeployments(byKind map[string][]object) []string {
	var bad []string
	fail := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }
	deps := map[string]*appsv1.Deployment{}
	for _, o := range byKind["Deployment"] {
		d := o.Obj.(*appsv1.Deployment)
		name := d.Spec.Template.Labels["app.kubernetes.io/name"]
		deps[name] = d
		if d.Spec.Selector == nil || len(d.Spec.Selector.MatchLabels) == 0 {
			fail("%s: no selector", o)
		}
		for k, v := range d.Spec.Selector.MatchLabels {
			if d.Spec.Template.Labels[k] != v {
				fail("%s: selector %s=%s does not match the template", o, k, v)
			}
		}
		for _, c := range d.Spec.Template.Spec.Containers {
			ports := map[string]int32{}
			for _, p := range c.Ports {
				ports[p.Name] = p.ContainerPort
			}
			probe := func(kind string, p *corev1.Probe, want string) {
				switch {
				case p == nil || p.HTTPGet == nil:
					fail("%s container %s: %s probe must be an HTTP GET of %s", o, c.Name, kind, want)
				case p.HTTPGet.Path != want:
					fail("%s container %s: %s probe path %s, want %s", o, c.Name, kind, p.HTTPGet.Path, want)
				case p.HTTPGet.Port.Type == intstr.String && ports[p.HTTPGet.Port.StrVal] == 0:
					fail("%s container %s: %s probe port %s is not a container port", o, c.Name, kind, p.HTTPGet.Port.StrVal)
				}
			}
			probe("readiness", c.ReadinessProbe, "/readyz")
			// /readyz checks PostgreSQL; liveness must not, or a database
			// outage restarts every pod.
			probe("liveness", c.LivenessProbe, "/healthz")
			grace, err := envDuration(c, "SHUTDOWN_GRACE", defaultShutdownGrace)
			if err != nil {
				fail("%s container %s: SHUTDOWN_GRACE: %v", o, c.Name, err)
				continue
			}
			var preStop time.Duration
			if c.Lifecycle != nil && c.Lifecycle.PreStop != nil && c.Lifecycle.PreStop.Sleep != nil {
				preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
			}
			tgp := d.Spec.Template.Spec.TerminationGracePeriodSeconds
			if tgp == nil || time.Duration(*tgp)*time.Second <= grace+preStop {
				fail("%s: terminationGracePeriodSeconds must exceed preStop %s + SHUTDOWN_GRACE %s", o, preStop, grace)
			}
		}
	}
	var migrateDeadline int64
	for _, o := range byKind["Job"] {
		if j := o.Obj.(*batchv1.Job); j.Spec.ActiveDeadlineSeconds != nil {
			migrateDeadline = max(migrateDeadline, *j.Spec.ActiveDeadlineSeconds)
		}
	}
	for _, name := range []string{"ingest-api", "delivery-worker"} {
		d, ok := deps[name]
		if !ok {
			fail("no Deployment for %s", name)
			continue
		}
		// Rolling upgrades (docs/operations.md): a new pod is unready until
		// the migrate Job has brought the schema up to its release, and the
		// old pods are all that serve meanwhile. None may go before a new
		// one is ready, and the rollout must not be declared failed while
		// the Job may still run.
		if ru := d.Spec.Strategy.RollingUpdate; d.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType ||
			ru == nil || ru.MaxUnavailable == nil || ru.MaxUnavailable.String() != "0" && ru.MaxUnavailable.String() != "0%" {
			fail("%s: a RollingUpdate with maxUnavailable 0 is required, so old pods serve until new ones are ready", name)
		}
		if pd := d.Spec.ProgressDeadlineSeconds; pd == nil || int64(*pd) <= migrateDeadline {
			fail("%s: progressDeadlineSeconds must exceed the migrate Job's activeDeadlineSeconds %d", name, migrateDeadline)
		}
		covered := false
		for _, o := range byKind["PodDisruptionBudget"] {
			pdb := o.Obj.(*policyv1.PodDisruptionBudget)
			if pdb.Spec.Selector != nil && selects(pdb.Spec.Selector.MatchLabels, d.Spec.Template.Labels) {
				covered = true
				if pdb.Spec.MinAvailable == nil && pdb.Spec.MaxUnavailable == nil {
					fail("%s: neither minAvailable nor maxUnavailable", o)
				}
			}
		}
		if !covered {
			fail("%s: no PodDisruptionBudget", name)
		}
	}
	if d, ok := deps["ingest-api"]; ok {
		svcOK := false
		for _, o := range byKind["Service"] {
			s := o.Obj.(*corev1.Service)
			if selects(s.Spec.Selector, d.Spec.Template.Labels) {
				for _, p := range s.Spec.Ports {
					if p.TargetPort.String() == "http" || p.TargetPort.IntValue() == 8080 {
						svcOK = true
					}
				}
			}
		}
		if !svcOK {
			fail("ingest-api: no Service reaching its http port")
		}
		hpaOK := false
		for _, o := range byKind["HorizontalPodAutoscaler"] {
			h := o.Obj.(*autoscalingv2.HorizontalPodAutoscaler)
			if h.Spec.ScaleTargetRef.Kind == "Deployment" && h.Spec.ScaleTargetRef.Name == d.Name {
				hpaOK = true
				if h.Spec.MinReplicas == nil || *h.Spec.MinReplicas < 1 || *h.Spec.MinReplicas > h.Spec.MaxReplicas {
					fail("%s: replica bounds", o)
				}
				if len(h.Spec.Metrics) == 0 {
					fail("%s: no metrics", o)
				}
			}
		}
		if !hpaOK {
			fail("ingest-api: no HorizontalPodAutoscaler targets %s", d.Name)
		}
		if d.Spec.Replicas != nil {
			fail("ingest-api: replicas set although the HorizontalPodAutoscaler owns the count")
		}
	}
	return bad
}

func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func checkJobs(byKind map[string][]object) []string {
	var bad []string
	fail := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }
	if n := len(byKind["CronJob"]); n != 2 {
		fail("want two CronJobs (retention-janitor, analyze), got %d", n)
	}
	for _, o := range byKind["CronJob"] {
		cj := o.Obj.(*batchv1.CronJob)
		s := cj.Spec
		if s.ConcurrencyPolicy != batchv1.ForbidConcurrent {
			fail("%s: concurrencyPolicy %q, want Forbid", o, s.ConcurrencyPolicy)
		}
		if s.StartingDeadlineSeconds == nil || *s.StartingDeadlineSeconds <= 0 {
			fail("%s: startingDeadlineSeconds must be set", o)
		}
		if s.SuccessfulJobsHistoryLimit == nil || s.FailedJobsHistoryLimit == nil {
			fail("%s: job history limits must be set", o)
		}
		if s.Suspend != nil && *s.Suspend {
			fail("%s: suspended", o)
		}
		js := s.JobTemplate.Spec
		if rp := js.Template.Spec.RestartPolicy; rp != corev1.RestartPolicyNever && rp != corev1.RestartPolicyOnFailure {
			fail("%s: restartPolicy %q", o, rp)
		}
		for _, c := range js.Template.Spec.Containers {
			timeout, err := envDuration(c, "JANITOR_TIMEOUT", defaultJanitorTimeout)
			if err != nil {
				fail("%s: JANITOR_TIMEOUT: %v", o, err)
				continue
			}
			// The deadline kills the pod; the janitor's own timeout must end
			// the cycle first, cleanly.
			if js.ActiveDeadlineSeconds == nil || time.Duration(*js.ActiveDeadlineSeconds)*time.Second <= timeout {
				fail("%s: activeDeadlineSeconds must exceed JANITOR_TIMEOUT %s", o, timeout)
			}
		}
	}
	var migrate []*batchv1.Job
	for _, o := range byKind["Job"] {
		j := o.Obj.(*batchv1.Job)
		migrate = append(migrate, j)
		if rp := j.Spec.Template.Spec.RestartPolicy; rp != corev1.RestartPolicyNever && rp != corev1.RestartPolicyOnFailure {
			fail("%s: restartPolicy %q", o, rp)
		}
		if j.Spec.ActiveDeadlineSeconds == nil || j.Spec.BackoffLimit == nil {
			fail("%s: activeDeadlineSeconds and backoffLimit must be set", o)
		}
		for _, c := range j.Spec.Template.Spec.Containers {
			if !slices.Equal(append(slices.Clone(c.Command), c.Args...), []string{"migrate"}) {
				fail("%s: runs %v, want envctl migrate", o, append(c.Command, c.Args...))
			}
			// The pod template is immutable: a new release needs a new Job
			// name, so the name carries the envctl image's tag.
			_, tag, _ := strings.Cut(path.Base(c.Image), ":")
			if want := "-v" + strings.ReplaceAll(tag, ".", "-"); tag == "" || !strings.HasSuffix(j.Name, want) {
				fail("%s: name must end with %q, the release of image %s", o, want, c.Image)
			}
		}
	}
	if len(migrate) != 1 {
		fail("want one migration Job, got %d", len(migrate))
	}
	return bad
}

// ports lists "PROTO/port" of a rule's ports.
func ports(ps []networkingv1.NetworkPolicyPort) []string {
	var out []string
	for _, p := range ps {
		proto := "TCP"
		if p.Protocol != nil {
			proto = string(*p.Protocol)
		}
		port := "*"
		if p.Port != nil {
			port = p.Port.String()
		}
		out = append(out, proto+"/"+port)
	}
	return out
}

func fromMonitoring(peers []networkingv1.NetworkPolicyPeer) bool {
	if len(peers) == 0 {
		return false
	}
	for _, p := range peers {
		if p.NamespaceSelector == nil || p.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != "monitoring" || p.IPBlock != nil {
			return false
		}
	}
	return true
}

func checkNetworkPolicies(byKind map[string][]object) []string {
	var bad []string
	fail := func(format string, a ...any) { bad = append(bad, fmt.Sprintf(format, a...)) }
	byApp := map[string]*networkingv1.NetworkPolicy{}
	defaultDeny := false
	for _, o := range byKind["NetworkPolicy"] {
		np := o.Obj.(*networkingv1.NetworkPolicy)
		sel := np.Spec.PodSelector
		if len(sel.MatchLabels) == 0 && len(sel.MatchExpressions) == 0 {
			if len(np.Spec.Ingress) == 0 && len(np.Spec.Egress) == 0 &&
				slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) &&
				slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
				defaultDeny = true
			} else {
				fail("%s: selects every pod but is not a default deny", o)
			}
			continue
		}
		app := sel.MatchLabels["app.kubernetes.io/name"]
		if app == "" {
			app = sel.MatchLabels["app.kubernetes.io/component"]
		}
		byApp[app] = np
	}
	if !defaultDeny {
		fail("no default-deny NetworkPolicy")
	}
	for _, app := range []string{"ingest-api", "delivery-worker", "retention-janitor", "migrate"} {
		np, ok := byApp[app]
		if !ok {
			fail("%s: no NetworkPolicy", app)
			continue
		}
		var egress []string
		for _, r := range np.Spec.Egress {
			egress = append(egress, ports(r.Ports)...)
			if len(r.Ports) == 0 {
				fail("%s: an egress rule without ports", app)
			}
		}
		for _, want := range []string{"UDP/53", "TCP/5432"} {
			if !slices.Contains(egress, want) {
				fail("%s: egress lacks %s", app, want)
			}
		}
		allowed := map[string][]string{
			"ingest-api":        {"UDP/53", "TCP/53", "TCP/5432"},
			"delivery-worker":   {"UDP/53", "TCP/53", "TCP/5432", "TCP/443"},
			"retention-janitor": {"UDP/53", "TCP/53", "TCP/5432", "TCP/9091"},
			"migrate":           {"UDP/53", "TCP/53", "TCP/5432"},
		}[app]
		for _, p := range egress {
			if !slices.Contains(allowed, p) {
				fail("%s: unexpected egress %s", app, p)
			}
		}
		if app == "delivery-worker" && !slices.Contains(egress, "TCP/443") {
			fail("delivery-worker: egress lacks HTTPS 443")
		}
		for _, r := range np.Spec.Ingress {
			ps := ports(r.Ports)
			switch {
			case len(ps) == 0:
				fail("%s: an ingress rule without ports", app)
			case app == "ingest-api" && len(r.From) == 0 && slices.Equal(ps, []string{"TCP/8080"}):
				// the API port, from anywhere
			case slices.Equal(ps, []string{"TCP/9090"}) && fromMonitoring(r.From) && (app == "ingest-api" || app == "delivery-worker"):
				// metrics, from the monitoring namespace only
			default:
				fail("%s: unexpected ingress %v from %v", app, ps, r.From)
			}
		}
	}
	return bad
}

// overlayDirs lists the overlays to validate.
func overlayDirs() ([]string, error) {
	return filepath.Glob(filepath.Join("overlays", "*"))
}
