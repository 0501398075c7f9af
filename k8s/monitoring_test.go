package k8s

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// What the test builds into the binaries, to find it again in --version and
// in envelopeworker_build_info.
const (
	testVersion  = "v9.9.9-monitoring"
	testRevision = "0123456789abcdef"
	buildinfoPkg = "github.com/envelopeworker/envelopeworker/modules/buildinfo"
	buildInfo    = "envelopeworker_build_info"
)

// grafanaVars are the dashboard's Grafana variables, replaced by what
// Prometheus would see so the expressions parse as PromQL.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h")

// queryExpr is one PromQL expression of the rules or the dashboard.
type queryExpr struct{ where, expr string }

// monitoring renders the prod overlay and returns its PrometheusRule and the
// dashboard JSON its ConfigMap carries.
func monitoring(t *testing.T) (*monitoringv1.PrometheusRule, []byte) {
	t.Helper()
	objs, err := render(filepath.Join("overlays", "prod"))
	if err != nil {
		t.Fatal(err)
	}
	var rule *monitoringv1.PrometheusRule
	var dashboard []byte
	for _, o := range objs {
		switch v := o.Obj.(type) {
		case *monitoringv1.PrometheusRule:
			rule = v
		case *corev1.ConfigMap:
			dashboard = []byte(v.Data["envelopeworker.json"])
		}
	}
	if rule == nil || dashboard == nil {
		t.Fatalf("prod overlay: PrometheusRule %v, dashboard %d bytes; want both", rule != nil, len(dashboard))
	}
	return rule, dashboard
}

// ruleExprs parses the rule groups with Prometheus's own rule file parser
// (which parses every expression with the PromQL parser and checks names,
// durations and templates) and returns their expressions.
func ruleExprs(t *testing.T, rule *monitoringv1.PrometheusRule) []queryExpr {
	t.Helper()
	y, err := yaml.Marshal(rule.Spec)
	if err != nil {
		t.Fatal(err)
	}
	groups, errs := rulefmt.Parse(y, false, model.UTF8Validation, parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Errorf("rules: %v", err)
	}
	if len(errs) > 0 {
		t.FailNow()
	}
	var out []queryExpr
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				t.Errorf("group %s: rule %q is not an alert", g.Name, r.Record)
			}
			if s := r.Labels["severity"]; s != "page" && s != "warning" {
				t.Errorf("alert %s: severity %q, want page or warning", r.Alert, s)
			}
			if r.Annotations["summary"] == "" {
				t.Errorf("alert %s: no summary", r.Alert)
			}
			out = append(out, queryExpr{"alert " + r.Alert, r.Expr})
		}
	}
	return out
}

type dashboardPanel struct {
	Title   string           `json:"title"`
	Panels  []dashboardPanel `json:"panels"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func dashboardExprs(t *testing.T, dashboard []byte) []queryExpr {
	t.Helper()
	var d struct {
		UID    string           `json:"uid"`
		Panels []dashboardPanel `json:"panels"`
	}
	dec := json.NewDecoder(bytes.NewReader(dashboard))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	var out []queryExpr
	var walk func([]dashboardPanel)
	walk = func(ps []dashboardPanel) {
		for _, p := range ps {
			walk(p.Panels)
			for _, tg := range p.Targets {
				out = append(out, queryExpr{"panel " + p.Title, grafanaVars.Replace(tg.Expr)})
			}
		}
	}
	walk(d.Panels)
	if d.UID == "" || len(out) == 0 {
		t.Fatalf("dashboard uid %q with %d queries", d.UID, len(out))
	}
	return out
}

// selectors parses expr and returns each metric it selects with the label
// names its matchers use.
func selectors(expr string) (map[string][]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	out := map[string][]string{}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		var labels []string
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel {
				name = m.Value
				continue
			}
			labels = append(labels, m.Name)
		}
		out[name] = append(out[name], labels...)
		return nil
	})
	return out, nil
}

func TestMonitoringRulesAndDashboardParse(t *testing.T) {
	rule, dashboard := monitoring(t)
	exprs := append(ruleExprs(t, rule), dashboardExprs(t, dashboard)...)
	for _, q := range exprs {
		sel, err := selectors(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		for name := range sel {
			if !strings.HasPrefix(name, "envelopeworker_") {
				t.Errorf("%s: selects %q, not a metric of envelopeworker", q.where, name)
			}
		}
	}
}

// exported is what one binary exports: series name -> label names.
type exported map[string]map[string]bool

func (e exported) add(families map[string]*dto.MetricFamily) {
	for name, mf := range families {
		series := []string{name}
		extra := ""
		switch mf.GetType() {
		case dto.MetricType_HISTOGRAM:
			series = []string{name + "_bucket", name + "_sum", name + "_count"}
			extra = "le"
		case dto.MetricType_SUMMARY:
			series = []string{name, name + "_sum", name + "_count"}
			extra = "quantile"
		}
		for _, s := range series {
			if e[s] == nil {
				e[s] = map[string]bool{}
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					e[s][l.GetName()] = true
				}
			}
			if extra != "" && s != name+"_sum" && s != name+"_count" {
				e[s][extra] = true
			}
		}
	}
}

func decodeFamilies(r io.Reader, format expfmt.Format) (map[string]*dto.MetricFamily, error) {
	dec := expfmt.NewDecoder(r, format)
	out := map[string]*dto.MetricFamily{}
	for {
		mf := &dto.MetricFamily{}
		if err := dec.Decode(mf); err == io.EOF {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		out[mf.GetName()] = mf
	}
}

// TestMonitoringNamesWhatBinariesExport builds the real binaries, runs them
// against PostgreSQL with a little traffic, scrapes their /metrics (and takes
// the janitor's push), and checks that every metric the rules and the
// dashboard select, with every label their matchers name, is exported.
// A misspelt or renamed metric would otherwise make an alert that never fires.
func TestMonitoringNamesWhatBinariesExport(t *testing.T) {
	rule, dashboard := monitoring(t)
	exprs := append(ruleExprs(t, rule), dashboardExprs(t, dashboard)...)
	st := newStack(t)
	got := map[string]exported{}
	for bin, fams := range st.run(t) {
		got[bin] = exported{}
		got[bin].add(fams)
		// build_info: the -ldflags values, on every binary.
		mf := fams[buildInfo]
		if mf == nil || len(mf.GetMetric()) != 1 {
			t.Errorf("%s: %s not exported once: %v", bin, buildInfo, mf)
			continue
		}
		lbl := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			lbl[l.GetName()] = l.GetValue()
		}
		if lbl["version"] != testVersion || lbl["revision"] != testRevision || !strings.HasPrefix(lbl["go_version"], "go") || len(lbl) != 3 {
			t.Errorf("%s: %s labels %v", bin, buildInfo, lbl)
		}
	}
	all := exported{}
	for _, e := range got {
		for s, ls := range e {
			if all[s] == nil {
				all[s] = map[string]bool{}
			}
			for l := range ls {
				all[s][l] = true
			}
		}
	}
	checked := 0
	for _, q := range exprs {
		sel, err := selectors(q.expr)
		if err != nil {
			t.Fatalf("%s: %v", q.where, err)
		}
		for name, labels := range sel {
			ls, ok := all[name]
			if !ok {
				t.Errorf("%s: %s is not exported by any binary", q.where, name)
				continue
			}
			for _, l := range labels {
				if !ls[l] {
					t.Errorf("%s: %s has no label %q (it has %v)", q.where, name, l, keys(ls))
				}
			}
			checked++
		}
	}
	t.Logf("%d selectors of %d expressions found in the binaries' exports", checked, len(exprs))
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// stack is the built binaries and the databases they run against.
type stack struct {
	bin      string // directory of the binaries
	migrated string // DSN of a migrated database
	empty    string // DSN of a database with no schema: every query fails
	adminDSN string
}

func newStack(t *testing.T) *stack {
	t.Helper()
	admin := os.Getenv("TEST_DATABASE_URL")
	if admin == "" {
		t.Fatal("TEST_DATABASE_URL is required (a PostgreSQL superuser DSN)")
	}
	s := &stack{bin: t.TempDir(), adminDSN: admin}
	ldflags := fmt.Sprintf("-X %s.version=%s -X %s.revision=%s", buildinfoPkg, testVersion, buildinfoPkg, testRevision)
	builds := []struct{ name, dir, pkg string }{
		{"ingest-api", "../services/ingest-api", "."},
		{"delivery-worker", "../services/delivery-worker", "."},
		{"retention-janitor", "../services/retention-janitor", "."},
		{"envctl", "../tools", "./envctl"},
	}
	for _, b := range builds {
		cmd := exec.Command("go", "build", "-ldflags", ldflags, "-o", filepath.Join(s.bin, b.name), b.pkg)
		cmd.Dir = b.dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b.name, err, out)
		}
		// --version answers before any setting is read.
		out, err := exec.Command(filepath.Join(s.bin, b.name), "--version").Output()
		want := b.name + " " + testVersion + " (revision " + testRevision + ", go"
		if err != nil || !strings.HasPrefix(string(out), want) {
			t.Errorf("%s --version = %q, %v; want %q…", b.name, out, err, want)
		}
	}
	db, err := sql.Open("pgx", admin)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	suffix := make([]byte, 6)
	_, _ = rand.Read(suffix)
	for _, kind := range []string{"migrated", "empty"} {
		name := "envelopeworker_monitoring_" + hex.EncodeToString(suffix) + "_" + kind
		if _, err := db.Exec(`CREATE DATABASE "` + name + `"`); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = db.Exec(`DROP DATABASE IF EXISTS "` + name + `" WITH (FORCE)`) })
		u, err := url.Parse(admin)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = "/" + name
		if kind == "migrated" {
			s.migrated = u.String()
		} else {
			s.empty = u.String()
		}
	}
	if out, err := s.command("envctl", map[string]string{"DATABASE_URL": s.migrated}, "migrate").CombinedOutput(); err != nil {
		t.Fatalf("envctl migrate: %v\n%s", err, out)
	}
	return s
}

func (s *stack) command(name string, env map[string]string, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(s.bin, name), args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

// start runs a long-lived binary until the test ends.
func (s *stack) start(t *testing.T, name string, env map[string]string) {
	t.Helper()
	cmd := s.command(name, env)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
}

func withUser(t *testing.T, dsn, user string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(user)
	return u.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// scrape polls addr's /metrics until until(families) holds or 30 s pass.
func scrape(t *testing.T, addr string, until func(map[string]*dto.MetricFamily) bool) map[string]*dto.MetricFamily {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err == nil {
			fams, derr := decodeFamilies(resp.Body, expfmt.ResponseFormat(resp.Header))
			resp.Body.Close()
			if derr != nil {
				t.Fatalf("scrape %s: %v", addr, derr)
			}
			if until(fams) {
				return fams
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("scrape %s: %v; condition not met within 30s", addr, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func has(names ...string) func(map[string]*dto.MetricFamily) bool {
	return func(f map[string]*dto.MetricFamily) bool {
		for _, n := range names {
			if f[n] == nil {
				return false
			}
		}
		return true
	}
}

func post(t *testing.T, addr, path, token, body string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// run drives each binary through what makes its metrics appear and returns
// the families each exported (or, for the janitor, pushed).
func (s *stack) run(t *testing.T) map[string]map[string]*dto.MetricFamily {
	t.Helper()
	out := map[string]map[string]*dto.MetricFamily{}
	tokenOut, err := s.command("envctl", map[string]string{"DATABASE_URL": s.migrated},
		"credential", "issue", "--tenant", "t1", "--account", "a1", "--device", "d1", "--role", "device").Output()
	if err != nil {
		t.Fatalf("envctl credential issue: %v", err)
	}
	lines := strings.Fields(strings.TrimSpace(string(tokenOut)))
	token := lines[len(lines)-1]

	// ingest-api on the migrated database: an envelope answer, then a
	// request past the peer limit (one token an hour).
	api, metrics := freeAddr(t), freeAddr(t)
	s.start(t, "ingest-api", map[string]string{"DATABASE_URL": s.migrated, "INGEST_ADDR": api, "METRICS_ADDR": metrics,
		"PEER_LIMIT_TOKENS": "1", "PEER_LIMIT_INTERVAL": "1h"})
	scrape(t, metrics, has(buildInfo))
	post(t, api, "/v1/envelopes", token, `{}`)
	post(t, api, "/v1/envelopes", token, `{}`)
	ingest := scrape(t, metrics, has("envelopeworker_ingest_envelopes_total", "envelopeworker_ingest_limiter_refusals_total"))

	// ingest-api on a database without the schema: the credential lookup
	// fails, which is what store_errors_total counts.
	api2, metrics2 := freeAddr(t), freeAddr(t)
	s.start(t, "ingest-api", map[string]string{"DATABASE_URL": s.empty, "INGEST_ADDR": api2, "METRICS_ADDR": metrics2})
	scrape(t, metrics2, has(buildInfo))
	post(t, api2, "/v1/envelopes", token, `{}`)
	for n, f := range scrape(t, metrics2, has("envelopeworker_ingest_store_errors_total")) {
		if ingest[n] == nil {
			ingest[n] = f
		}
	}
	out["ingest-api"] = ingest

	// delivery-worker as a role without its grants (the janitor's): the
	// schema check passes, its sampling and claims fail (store_errors_total).
	secrets := filepath.Join(t.TempDir(), "secrets.json")
	if err := os.WriteFile(secrets, []byte(`{}`), 0o600); err != nil {
		t.Fatal(err)
	}
	wm := freeAddr(t)
	s.start(t, "delivery-worker", map[string]string{"DATABASE_URL": withUser(t, s.migrated, "envelopeworker_janitor"), "METRICS_ADDR": wm, "WEBHOOK_SECRETS_FILE": secrets,
		"DELIVERY_POLL_INTERVAL": "100ms"})
	out["delivery-worker"] = scrape(t, wm, has(buildInfo, "envelopeworker_delivery_store_errors_total", "envelopeworker_delivery_due_messages"))

	// retention-janitor: one run on the migrated database, pushed to a
	// stand-in Pushgateway.
	var mu sync.Mutex
	var pushed map[string]*dto.MetricFamily
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fams, err := decodeFamilies(r.Body, expfmt.ResponseFormat(r.Header))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		pushed = fams
		mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	defer gw.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	jan := exec.CommandContext(ctx, filepath.Join(s.bin, "retention-janitor"))
	jan.Env = []string{"DATABASE_URL=" + s.migrated, "PUSHGATEWAY_URL=" + gw.URL}
	if b, err := jan.CombinedOutput(); err != nil {
		t.Fatalf("retention-janitor: %v\n%s", err, b)
	}
	mu.Lock()
	out["retention-janitor"] = pushed
	mu.Unlock()
	if out["retention-janitor"] == nil {
		t.Fatal("retention-janitor pushed nothing")
	}
	return out
}
