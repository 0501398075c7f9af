package chaos

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/rs/zerolog"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/tools/internal/access"
)

// Scenario is one run: steady load while faults of Faults are injected, in turn (or, when Mixed, at
// random by two injectors at once, so faults overlap). Weight is its share of the run's fault time.
type Scenario struct {
	Name   string
	Faults []string
	Mixed  bool
	Weight float64
}

// Scenarios are the default set: each family of faults alone, then all of them mixed.
var Scenarios = []Scenario{
	{Name: "kill", Faults: []string{FaultKillIngest, FaultKillWorker}, Weight: 1},
	{Name: "postgres", Faults: []string{FaultPGRestartFast, FaultPGTerminate, FaultPGRestartImmediate, FaultPGTerminate}, Weight: 1.5},
	{Name: "proxy", Faults: []string{FaultProxyLatency, FaultProxyStall, FaultProxyReset}, Weight: 1.5},
	{Name: "sink", Faults: []string{FaultSinkStall, FaultSinkReset, FaultSinkSlow, FaultSink500, FaultSink429, FaultSinkFlap}, Weight: 2.5},
	{Name: "mixed", Faults: AllFaults, Mixed: true, Weight: 3.5},
}

// ScenarioDurations splits total over scenarios by weight.
func ScenarioDurations(total time.Duration, scs []Scenario) []time.Duration {
	sum := 0.0
	for _, sc := range scs {
		sum += sc.Weight
	}
	out := make([]time.Duration, len(scs))
	for i, sc := range scs {
		out[i] = time.Duration(float64(total) * sc.Weight / sum).Round(100 * time.Millisecond)
	}
	return out
}

// Config is shared by every scenario of a run.
type Config struct {
	Bins           Binaries
	Cluster        *Cluster
	WorkDir        string        // for secrets files; removed by the caller
	Duration       time.Duration // fault phase of the scenario
	Rate           float64       // envelopes per second
	OutboxRate     float64       // outbox messages per second
	OutboxClients  int           // concurrent outbox clients of the one service credential (0: 1)
	IngestReplicas int
	WorkerReplicas int
	Logf           func(format string, args ...any)
}

// Report is one scenario's figures.
type Report struct {
	Scenario string
	Elapsed  time.Duration
	Requests int                // HTTP requests the clients made to ingest-api
	Statuses string             // answers by route and status
	Faults   map[string]int     // faults injected, by kind
	Worker   map[string]float64 // watched worker counters (fenced settles, lease_lost attempts), summed
	Check    CheckResult
	Problems []Violation // process-level findings (a binary that exited by itself, an unclean stop)
}

// Violations is every violation of the scenario.
func (r Report) Violations() []Violation {
	return append(append([]Violation(nil), r.Problems...), r.Check.Violations...)
}

// FaultTotal is the number of faults injected.
func (r Report) FaultTotal() int {
	n := 0
	for _, c := range r.Faults {
		n += c
	}
	return n
}

func (r Report) String() string {
	kinds := make([]string, 0, len(r.Faults))
	for k := range r.Faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	var fs []string
	for _, k := range kinds {
		fs = append(fs, fmt.Sprintf("%s=%d", k, r.Faults[k]))
	}
	c := r.Check
	return fmt.Sprintf("scenario %s (%v): requests=%d faults=%d [%s] envelopes=%d acknowledged=%d unanswered=%d identities=%d "+
		"messages=%d delivered=%d dead=%d sink_requests=%d lease_expiries=%d reclaimed=%d fenced_settles=%.0f lease_lost=%.0f violations=%d; answers: %s",
		r.Scenario, r.Elapsed.Round(time.Second), r.Requests, r.FaultTotal(), strings.Join(fs, " "), c.Envelopes, c.Acknowledged,
		c.Unanswered, c.Identities, c.Messages, c.Delivered, c.Dead, c.SinkRequests, c.LeaseExpiries, c.Reclaimed,
		r.Worker["fenced_settles"], r.Worker["lease_lost_attempts"], len(r.Violations()), r.Statuses)
}

const tenant = "chaos"

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// createDatabase makes and migrates a fresh database in the cluster and returns its owner DSN.
func createDatabase(ctx context.Context, c *Cluster, name string) (string, error) {
	admin, err := sql.Open("pgx", c.DSN("postgres"))
	if err != nil {
		return "", fmt.Errorf("open admin: %w", err)
	}
	defer admin.Close()
	if _, err := admin.ExecContext(ctx, `CREATE DATABASE `+name); err != nil {
		return "", fmt.Errorf("create database: %w", err)
	}
	dsn := c.DSN(name)
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", name, err)
	}
	defer db.Close()
	if _, err := migrations.Apply(ctx, db); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	return dsn, nil
}

func roleDSN(addr, role, db string) string {
	return fmt.Sprintf("postgres://%s@%s/%s?sslmode=disable", role, addr, db)
}

// setup is a scenario's credentials, keys, endpoints and files.
type setup struct {
	producers   []ProducerCred
	service     string
	secretsFile string
	keysFile    string
}

func prepare(ctx context.Context, dsn, dir, sinkURL string, sinkSecret []byte, producers int) (setup, error) {
	var su setup
	st, err := store.Open(ctx, dsn, store.Options{MaxOpenConns: 2})
	if err != nil {
		return su, fmt.Errorf("open store: %w", err)
	}
	defer st.Close()
	for i := 1; i <= producers; i++ {
		dev := fmt.Sprintf("dev-%02d", i)
		pub, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return su, fmt.Errorf("key: %w", err)
		}
		if err := st.Credentials().AddKey(ctx, tenant, dev, pub); err != nil {
			return su, fmt.Errorf("add key: %w", err)
		}
		tok, _, err := st.Credentials().IssueCredential(ctx, tenant, "acct", dev, "device")
		if err != nil {
			return su, fmt.Errorf("credential: %w", err)
		}
		su.producers = append(su.producers, ProducerCred{Device: dev, KeyID: dev, Token: tok, Key: priv})
	}
	if su.service, _, err = st.Credentials().IssueCredential(ctx, tenant, "acct", "svc-1", "service"); err != nil {
		return su, fmt.Errorf("service credential: %w", err)
	}
	for _, path := range []string{"/a", "/b"} {
		if _, err := st.Outbox().AddEndpoint(ctx, store.Endpoint{TenantID: tenant, ProjectID: project, Topic: topic,
			URL: sinkURL + path, SecretRef: "chaos-hook"}); err != nil {
			return su, fmt.Errorf("endpoint: %w", err)
		}
	}
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return su, fmt.Errorf("seed: %w", err)
	}
	secrets, err := json.Marshal(map[string][]string{"chaos-hook": {"whsec_" + base64.StdEncoding.EncodeToString(sinkSecret)}})
	if err != nil {
		return su, fmt.Errorf("secrets: %w", err)
	}
	keys, err := json.Marshal(map[string]any{tenant: map[string]string{"key_id": "out-1", "seed": access.EncodeBase64URL(seed)}})
	if err != nil {
		return su, fmt.Errorf("keys: %w", err)
	}
	su.secretsFile, su.keysFile = filepath.Join(dir, "webhook-secrets.json"), filepath.Join(dir, "outbound-keys.json")
	if err := os.WriteFile(su.secretsFile, secrets, 0o600); err != nil {
		return su, fmt.Errorf("write secrets: %w", err)
	}
	if err := os.WriteFile(su.keysFile, keys, 0o600); err != nil {
		return su, fmt.Errorf("write keys: %w", err)
	}
	return su, nil
}

const (
	project = "proj"
	topic   = "chaos.events"
)

// RunScenario runs sc once on a fresh database of cfg.Cluster and checks the outcome. The error is for
// a harness failure (it could not set up, restart or check); what the system did wrong is in the
// report's violations.
func RunScenario(ctx context.Context, cfg Config, sc Scenario) (rep Report, err error) {
	start := time.Now()
	rep = Report{Scenario: sc.Name, Faults: map[string]int{}}
	defer func() { rep.Elapsed = time.Since(start) }()
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	dbName := "chaos_" + sc.Name + "_" + randHex(4)
	dsn, err := createDatabase(ctx, cfg.Cluster, dbName)
	if err != nil {
		return rep, err
	}
	dir, err := os.MkdirTemp(cfg.WorkDir, sc.Name+"-")
	if err != nil {
		return rep, fmt.Errorf("work dir: %w", err)
	}
	sinkSecret := make([]byte, 32)
	if _, err := rand.Read(sinkSecret); err != nil {
		return rep, fmt.Errorf("sink secret: %w", err)
	}
	sink, err := NewSink(sinkSecret)
	if err != nil {
		return rep, err
	}
	defer sink.Close()
	su, err := prepare(ctx, dsn, dir, sink.URL(), sinkSecret, 8)
	if err != nil {
		return rep, err
	}
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		return rep, fmt.Errorf("open admin: %w", err)
	}
	defer admin.Close()
	admin.SetMaxOpenConns(2)

	// An in-process Toxiproxy proxy between each replica and PostgreSQL, so a fault can slow one
	// worker down while the others go on (its settles then arrive after its leases expired).
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	var proxies []*toxiproxy.Proxy
	newProxy := func(name string) (string, error) {
		p := toxiproxy.NewProxy(tp, name, "127.0.0.1:0", cfg.Cluster.Addr())
		if err := p.Start(); err != nil {
			return "", fmt.Errorf("proxy %s: %w", name, err)
		}
		proxies = append(proxies, p)
		return p.Listen, nil
	}
	defer func() {
		for _, p := range proxies {
			p.Stop()
		}
	}()

	r := &rig{cluster: cfg.Cluster, admin: admin, sink: sink,
		rnd: mrand.New(mrand.NewPCG(mrand.Uint64(), mrand.Uint64())), counts: map[string]int{}, busy: map[any]bool{}}
	var urls []string
	for i := range cfg.IngestReplicas {
		addr, err := freeAddr()
		if err != nil {
			return rep, err
		}
		maddr, err := freeAddr()
		if err != nil {
			return rep, err
		}
		paddr, err := newProxy(fmt.Sprintf("ingest-%d", i+1))
		if err != nil {
			return rep, err
		}
		env := []string{
			"DATABASE_URL=" + roleDSN(paddr, "envelopeworker_ingest", dbName),
			"INGEST_ADDR=" + addr, "METRICS_ADDR=" + maddr, "OUTBOUND_SIGNING_KEYS_FILE=" + su.keysFile,
			"SYNC_LIMIT_TOKENS=20000", "SYNC_LIMIT_INTERVAL=1s", "PEER_LIMIT_TOKENS=20000", "PEER_LIMIT_INTERVAL=1s",
			"STORE_TIMEOUT=3s", "DB_MAX_OPEN_CONNS=8", "SHUTDOWN_GRACE=5s", "LOG_LEVEL=warn",
		}
		r.ingest = append(r.ingest, newReplica(fmt.Sprintf("ingest-api-%d", i+1), cfg.Bins.Ingest, env, "http://"+addr+"/readyz"))
		urls = append(urls, "http://"+addr)
	}
	for i := range cfg.WorkerReplicas {
		maddr, err := freeAddr()
		if err != nil {
			return rep, err
		}
		paddr, err := newProxy(fmt.Sprintf("worker-%d", i+1))
		if err != nil {
			return rep, err
		}
		env := []string{
			"DATABASE_URL=" + roleDSN(paddr, "envelopeworker_delivery", dbName),
			"METRICS_ADDR=" + maddr, "WEBHOOK_SECRETS_FILE=" + su.secretsFile,
			"DELIVERY_LEASE=3s", "DELIVERY_BACKOFF_BASE=50ms", "DELIVERY_BACKOFF_MAX=1s",
			"DELIVERY_ALLOW_INSECURE_LOOPBACK=true", "DELIVERY_CONCURRENCY=32", "DELIVERY_CLAIM_SIZE=16",
			"DELIVERY_POLL_INTERVAL=50ms", "DELIVERY_LIMIT_TOKENS=20000", "DELIVERY_LIMIT_INTERVAL=1s",
			"STORE_TIMEOUT=2s", "DB_MAX_OPEN_CONNS=6", "SHUTDOWN_GRACE=3s", "LOG_LEVEL=warn",
		}
		w := newReplica(fmt.Sprintf("delivery-worker-%d", i+1), cfg.Bins.Worker, env, "http://"+maddr+"/readyz")
		w.metricsURL = "http://" + maddr + "/metrics"
		r.workers = append(r.workers, w)
	}
	r.proxies = proxies
	all := append(append([]*Replica(nil), r.ingest...), r.workers...)
	defer func() {
		for _, p := range all {
			p.Kill() // a no-op for the ones stopped below
		}
	}()
	for _, p := range all {
		if err := p.Start(ctx, 60*time.Second); err != nil {
			return rep, err
		}
	}

	ledger := newLedger()
	ld := newLoad(loadConfig{Tenant: tenant, Project: project, Producers: su.producers, Service: su.service,
		Topic: topic, URLs: func() []string { return urls }, Rate: cfg.Rate, OutboxRate: cfg.OutboxRate,
		OutboxClients: cfg.OutboxClients}, ledger)
	stop, cancelStop := context.WithTimeout(ctx, cfg.Duration)
	defer cancelStop()
	drain, cancelDrain := context.WithTimeout(ctx, cfg.Duration+90*time.Second)
	defer cancelDrain()
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		ld.run(stop, drain)
	}()

	// Faults start once the load is steady and end a little before it, so the last requests meet a
	// healthy system (and every client gets a definitive answer).
	faultCtx, cancelFaults := context.WithTimeout(ctx, cfg.Duration-min(cfg.Duration/5, 3*time.Second))
	defer cancelFaults()
	sleepCtx(faultCtx, min(cfg.Duration/10, 2*time.Second))
	injectors := 1
	if sc.Mixed {
		injectors = 2
	}
	errs := make(chan error, injectors)
	var wg sync.WaitGroup
	for range injectors {
		wg.Go(func() { errs <- r.injectLoop(faultCtx, sc.Faults, sc.Mixed) })
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		if e != nil && err == nil {
			err = e
		}
	}
	rep.Faults = r.counts
	if err != nil {
		cancelStop()
		cancelDrain()
		<-loadDone
		return rep, err
	}
	faultsEnd := time.Now()
	logf("%s: faults done (%d), waiting for the clients", sc.Name, r.FaultTotalLocked())
	<-loadDone
	phase := time.Now()
	rep.Requests, rep.Statuses = ledger.Requests, ledger.StatusSummary()

	for _, p := range all {
		if !p.Running() {
			rep.Problems = append(rep.Problems, Violation{Check: "binary_exited",
				Detail: fmt.Sprintf("%s exited by itself: %v\n%s", p.Name, p.exitError(), lastLines(p.Logs(), 20))})
			if err := p.Start(ctx, 60*time.Second); err != nil {
				return rep, err
			}
		}
	}
	if err := waitDrained(drain, admin); err != nil {
		logf("%s: %v", sc.Name, err) // the checker reports what is left as message_lost
	}
	logf("%s: clients done %v after the faults; outbox drained in %v", sc.Name, phase.Sub(faultsEnd).Round(100*time.Millisecond),
		time.Since(phase).Round(100*time.Millisecond))
	phase = time.Now()
	for _, p := range all {
		if err := p.Stop(15 * time.Second); err != nil {
			rep.Problems = append(rep.Problems, Violation{Check: "unclean_stop", Detail: err.Error() + "\n" + lastLines(p.Logs(), 20)})
		}
	}
	rep.Worker = map[string]float64{}
	for _, w := range r.workers {
		for k, v := range w.Counters() {
			rep.Worker[k] += v
		}
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	stopped := time.Now()
	rep.Check, err = Check(cctx, admin, tenant, ledger, sink.Receipts())
	if err != nil {
		return rep, err
	}
	logf("%s: replicas stopped in %v, checked in %v", sc.Name, stopped.Sub(phase).Round(100*time.Millisecond),
		time.Since(stopped).Round(100*time.Millisecond))
	if _, err := admin.ExecContext(cctx, "SELECT 1"); err == nil {
		_ = admin.Close()
		if db, err := sql.Open("pgx", cfg.Cluster.DSN("postgres")); err == nil {
			_, _ = db.ExecContext(cctx, `DROP DATABASE IF EXISTS `+dbName+` WITH (FORCE)`)
			_ = db.Close()
		}
	}
	_ = os.RemoveAll(dir)
	return rep, nil
}

// FaultTotalLocked counts the faults so far.
func (r *rig) FaultTotalLocked() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.counts {
		n += c
	}
	return n
}

// waitDrained polls until no outbox message is pending or delivering, or ctx ends.
func waitDrained(ctx context.Context, db *sql.DB) error {
	for {
		var n int
		err := db.QueryRowContext(ctx, `SELECT count(*) FROM outbox_messages WHERE status IN ('pending', 'delivering')`).Scan(&n)
		if err == nil && n == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("outbox not drained: %d messages pending or delivering (%v)", n, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
