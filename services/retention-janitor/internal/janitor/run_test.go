package janitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"

	"github.com/envelopeworker/envelopeworker/migrations"
	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/modules/store"
	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/config"
)

func TestRunDeletesAndLogsOneSummary(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	storetest.Durable(t, f.adminDSN) // so the janitor's own synchronous_commit shows
	f.seed(t, 1, 3_000, 2_500)
	before := f.snapshot(t)
	sum, raw, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN})
	if err != nil {
		t.Fatalf("run: %v\n%s", err, raw)
	}
	if sum.Level != "INFO" || sum.RowsDeleted != 2_500 || sum.Batches != 25 || sum.StoppedBy != "done" || sum.Pushed || sum.Error != "" {
		t.Fatalf("summary = %+v", sum)
	}
	if sum.DurationSeconds <= 0 {
		t.Fatalf("duration_seconds = %v", sum.DurationSeconds)
	}
	if want := f.defaultWALCompression(t); sum.WALCompression != want || sum.SyncCommit != "off" {
		t.Fatalf("wal_compression = %q (want %q), synchronous_commit = %q (want off)", sum.WALCompression, want, sum.SyncCommit)
	}
	if expired, live := f.payloads(t); expired != 0 || live != 500 {
		t.Fatalf("after run: %d expired, %d live", expired, live)
	}
	f.assertUntouched(t, before)
	// The lock is released when the run ends: a second run proceeds.
	sum, _, err = runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN}, "--janitor-batch-size", "10")
	if err != nil || sum.StoppedBy != "done" || sum.RowsDeleted != 0 {
		t.Fatalf("second run: %+v, %v", sum, err)
	}
}

// The janitor compresses its page images where its role may (migration 0004)
// and the server knows the method; elsewhere it deletes at the server's
// setting, warns once, and the summary says what was used.
func TestRunWALCompression(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	server := f.serverWALCompression(t)
	run := func(t *testing.T, dsn, want string, warned bool, args ...string) {
		t.Helper()
		f.seed(t, f.count(t, `SELECT coalesce(max(sequence), 0) + 1 FROM event_identities`),
			f.count(t, `SELECT coalesce(max(sequence), 0) + 300 FROM event_identities`), 200)
		sum, raw, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": dsn}, args...)
		if err != nil || sum.StoppedBy != "done" || sum.RowsDeleted != 200 {
			t.Fatalf("run: %+v, %v\n%s", sum, err, raw)
		}
		if sum.WALCompression != want {
			t.Errorf("wal_compression = %q, want %q", sum.WALCompression, want)
		}
		if got := strings.Contains(raw, `"msg":"wal_compression stays at the server's setting"`); got != warned {
			t.Errorf("warning logged: %v, want %v:\n%s", got, warned, raw)
		}
	}
	t.Run("chosen", func(t *testing.T) {
		run(t, f.janitorDSN, f.defaultWALCompression(t), f.defaultWALCompression(t) != "lz4",
			"--janitor-wal-compression", "lz4")
		if f.grantable(t) {
			run(t, f.janitorDSN, "pglz", false, "--janitor-wal-compression", "pglz")
		}
	})
	t.Run("server's setting", func(t *testing.T) {
		run(t, f.janitorDSN, server, false, "--janitor-wal-compression", "server")
	})
	t.Run("role may not set it", func(t *testing.T) {
		// A role with the janitor's table privileges but not SET on the
		// parameter, as where the migrator was no superuser.
		role := fmt.Sprintf("envelopeworker_test_nowal_%x", time.Now().UnixNano())
		f.exec(t, `CREATE ROLE `+role+` LOGIN`)
		t.Cleanup(func() {
			// Its grants live in this database, which goes after this cleanup.
			_, _ = f.admin.Exec(`DROP OWNED BY ` + role)
			_, _ = f.admin.Exec(`DROP ROLE ` + role)
		})
		f.exec(t, `GRANT USAGE ON SCHEMA public TO `+role)
		f.exec(t, `GRANT SELECT ON schema_migrations TO `+role)
		// On the partitioned layout the janitor deletes partition by
		// partition, so the grants go to the partitions too, as the migrator
		// gives them.
		grant := func(privileges, table string) {
			f.exec(t, `GRANT `+privileges+` ON `+table+` TO `+role)
			if storetest.Layout() == migrations.LayoutPartitioned {
				for i := range migrations.Partitions {
					f.exec(t, `GRANT `+privileges+` ON `+migrations.PartitionName(table, i)+` TO `+role)
				}
			}
		}
		grant(`SELECT, DELETE`, `inbound_payloads`)
		grant(`SELECT, DELETE`, `outbound_bodies`)
		grant(`SELECT, DELETE`, `outbox_attempts`)
		grant(`SELECT (tenant_id, message_id, event_identity, status)`, `outbox_messages`)
		run(t, storetest.DSNForRole(f.adminDSN, role), server, true)
	})
}

// Each answer of the server to the lock session's trial SET: used, refused
// for the role (insufficient_privilege), or a method this server lacks
// (invalid_parameter_value; LoadConfig refuses unknown names, so the trial
// is driven here directly with one no server knows).
func TestTrySetWALCompression(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := context.Background()
	lock, err := tryLock(ctx, f.janitorDSN)
	if err != nil {
		t.Fatal(err)
	}
	defer unlock(ctx, lock)
	for _, tc := range []struct{ want, set, refused string }{
		{config.WALCompressionServer, "", ""},
		{"no-such-method", "", "this server does not support it"},
	} {
		set, refused, err := trySetWALCompression(ctx, lock, tc.want)
		if err != nil || set != tc.set || refused != tc.refused {
			t.Errorf("%s: set %q, refused %q, %v; want %q, %q", tc.want, set, refused, err, tc.set, tc.refused)
		}
	}
	if f.grantable(t) {
		if set, refused, err := trySetWALCompression(ctx, lock, "pglz"); err != nil || set != "pglz" || refused != "" {
			t.Errorf("pglz as the janitor: set %q, refused %q, %v", set, refused, err)
		}
	}
	// A connection that is gone is a failure of the run, not a refusal.
	dead, err := store.TryLock(ctx, f.janitorDSN, "janitor-test", LockKey+1)
	if err != nil {
		t.Fatal(err)
	}
	_ = dead.Release(ctx)
	if _, _, err := trySetWALCompression(ctx, dead, "lz4"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("closed connection: %v, want ErrUnavailable", err)
	}
}

func TestRunSkipsWhenAnotherRunHoldsTheLock(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 100, 100)
	conn, err := f.admin.Conn(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(context.Background(), `SELECT pg_advisory_lock($1)`, LockKey); err != nil {
		t.Fatal(err)
	}
	gw := newGateway(t, http.StatusOK)
	sum, raw, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN, "PUSHGATEWAY_URL": gw.URL})
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if sum.StoppedBy != "lock_held" || sum.RowsDeleted != 0 || sum.Batches != 0 || sum.Pushed {
		t.Fatalf("summary = %+v", sum)
	}
	if !strings.Contains(raw, "holds the advisory lock") {
		t.Fatalf("no lock message in:\n%s", raw)
	}
	if n := len(gw.requests()); n != 0 {
		t.Fatalf("a skipped run pushed %d times", n)
	}
	if expired, _ := f.payloads(t); expired != 100 {
		t.Fatalf("expired payloads = %d, want 100 untouched", expired)
	}
	// Released: the next run deletes.
	if _, err := conn.ExecContext(context.Background(), `SELECT pg_advisory_unlock($1)`, LockKey); err != nil {
		t.Fatal(err)
	}
	sum, _, err = runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN})
	if err != nil || sum.RowsDeleted != 100 {
		t.Fatalf("run after unlock: %+v, %v", sum, err)
	}
}

func TestTwoRunsAtOnce(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 30_000, 25_000)
	var wg sync.WaitGroup
	sums := make([]summaryLine, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sums[i], _, errs[i] = runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN})
		}()
	}
	wg.Wait()
	for i := range 2 {
		if errs[i] != nil {
			t.Fatalf("run %d: %v", i, errs[i])
		}
		// Either the runs did not overlap (both done, the later one finds
		// nothing) or one found the lock held.
		if s := sums[i].StoppedBy; s != "done" && s != "lock_held" {
			t.Fatalf("run %d stopped by %s", i, s)
		}
	}
	if total := sums[0].RowsDeleted + sums[1].RowsDeleted; total != 25_000 {
		t.Fatalf("rows deleted %d + %d, want 25000", sums[0].RowsDeleted, sums[1].RowsDeleted)
	}
	if expired, live := f.payloads(t); expired != 0 || live != 5_000 {
		t.Fatalf("after runs: %d expired, %d live", expired, live)
	}
}

func TestRunTimeoutIsACleanStop(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 100, 100)
	sum, _, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN, "JANITOR_TIMEOUT": "1ns"})
	if err != nil {
		t.Fatalf("a timeout is not a failure: %v", err)
	}
	if sum.StoppedBy != "timeout" || sum.RowsDeleted != 0 || sum.Batches != 0 || sum.Level != "INFO" {
		t.Fatalf("summary = %+v", sum)
	}
	if expired, _ := f.payloads(t); expired != 100 {
		t.Fatalf("expired payloads = %d, want 100 left for the next run", expired)
	}
}

// TestRunSchemaVersions: the janitor runs on a schema at or above its build's
// (a later release's migrate Job may have run first: migrations are
// additive) and fails on an older one, naming the reason.
func TestRunSchemaVersions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 100, 40)
	f.exec(t, `INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, 'from_a_later_release.sql', 'not-ours')`, migrations.Latest()+1)
	sum, raw, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN})
	if err != nil || sum.StoppedBy != "done" || sum.RowsDeleted != 40 {
		t.Fatalf("schema newer than the build: %+v, %v\n%s", sum, err, raw)
	}
	f.exec(t, `DELETE FROM schema_migrations WHERE version >= $1`, migrations.Latest())
	f.seed(t, 101, 200, 40)
	sum, raw, err = runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN})
	if !errors.Is(err, store.ErrSchemaBehind) || sum.StoppedBy != "error" || !strings.Contains(sum.Error, "envctl migrate") {
		t.Fatalf("schema older than the build: %+v, %v\n%s", sum, err, raw)
	}
	if expired, _ := f.payloads(t); expired != 40 {
		t.Fatalf("%d expired payloads after a refused run, want the 40 untouched", expired)
	}
}

func TestRunFailures(t *testing.T) {
	t.Parallel()
	t.Run("schema not migrated", func(t *testing.T) {
		t.Parallel()
		dsn := storetest.DSNForRole(storetest.NewEmptyDatabase(t), janitorRole)
		sum, _, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": dsn})
		if err == nil || sum.StoppedBy != "error" || sum.Level != "ERROR" || sum.Error == "" {
			t.Fatalf("summary %+v, err %v; want a failure", sum, err)
		}
	})
	t.Run("database unreachable", func(t *testing.T) {
		t.Parallel()
		// A password in the DSN must not reach the log or the error.
		dsn := strings.Replace(storetest.WithDatabase(storetest.AdminDSN(), "envelopeworker_no_such_db"), "://postgres@", "://postgres:pw-secret-1@", 1)
		sum, raw, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": dsn})
		if !errors.Is(err, store.ErrUnavailable) || sum.StoppedBy != "error" {
			t.Fatalf("summary %+v, err %v; want ErrUnavailable", sum, err)
		}
		if strings.Contains(raw, "pw-secret-1") || strings.Contains(err.Error(), "pw-secret-1") {
			t.Fatalf("password leaked: %s / %v", raw, err)
		}
	})
	t.Run("malformed url", func(t *testing.T) {
		t.Parallel()
		sum, raw, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": "postgres://u:pw-secret-2@[::1"})
		if !errors.Is(err, config.ErrInvalid) || sum.StoppedBy != "error" {
			t.Fatalf("summary %+v, err %v; want config.ErrInvalid", sum, err)
		}
		if strings.Contains(raw, "pw-secret-2") || strings.Contains(err.Error(), "pw-secret-2") {
			t.Fatalf("password leaked: %s / %v", raw, err)
		}
	})
}

// gateway is an httptest Pushgateway that records what it receives.
type gateway struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []pushed
}

type pushed struct {
	method, path, query string
	user, password      string
	families            map[string]*dto.MetricFamily
}

// gatewayAnswer is the body a gateway test double sends with a failure
// status: the run's error and log must not repeat it.
const gatewayAnswer = "gateway-answer-body"

func newGateway(t *testing.T, status int) *gateway {
	g := &gateway{}
	g.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fams := map[string]*dto.MetricFamily{}
		dec := expfmt.NewDecoder(r.Body, expfmt.ResponseFormat(r.Header))
		for {
			mf := &dto.MetricFamily{}
			if err := dec.Decode(mf); err != nil {
				if !errors.Is(err, io.EOF) {
					t.Errorf("decode pushed metrics: %v", err)
				}
				break
			}
			fams[mf.GetName()] = mf
		}
		user, password, _ := r.BasicAuth()
		g.mu.Lock()
		g.reqs = append(g.reqs, pushed{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery, user: user, password: password, families: fams})
		g.mu.Unlock()
		w.WriteHeader(status)
		if status >= 300 {
			_, _ = io.WriteString(w, gatewayAnswer)
		}
	}))
	t.Cleanup(g.Close)
	return g
}

func (g *gateway) requests() []pushed {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]pushed(nil), g.reqs...)
}

func gaugeValue(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	mf, ok := fams[name]
	if !ok || len(mf.GetMetric()) != 1 {
		t.Fatalf("metric %s missing or not single in push: %v", name, fams)
	}
	return mf.GetMetric()[0].GetGauge().GetValue()
}

func TestRunPushesMetrics(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 1_200, 1_200)
	gw := newGateway(t, http.StatusOK)
	sum, _, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN, "PUSHGATEWAY_URL": gw.URL})
	if err != nil {
		t.Fatal(err)
	}
	if !sum.Pushed || sum.RowsDeleted != 1_200 {
		t.Fatalf("summary = %+v", sum)
	}
	reqs := gw.requests()
	if len(reqs) != 1 {
		t.Fatalf("pushes = %d, want 1", len(reqs))
	}
	p := reqs[0]
	if p.method != http.MethodPut || p.path != "/metrics/job/"+PushJob {
		t.Fatalf("push %s %s", p.method, p.path)
	}
	want := []string{MetricRowsDeleted, MetricBatches, MetricDuration, MetricSuccess, MetricStoppedBy, MetricRunTimestamp, MetricLastSuccessTS,
		MetricOutboundBodiesDeleted, MetricOutboundAttemptsDeleted, MetricOutboundBatches, buildinfo.MetricName}
	if len(p.families) != len(want) {
		t.Errorf("pushed %d families, want %d: %v", len(p.families), len(want), p.families)
	}
	for _, name := range want {
		if _, ok := p.families[name]; !ok {
			t.Errorf("metric %s not pushed", name)
		}
	}
	if v := gaugeValue(t, p.families, MetricRowsDeleted); v != 1200 {
		t.Errorf("rows deleted = %v", v)
	}
	if v := gaugeValue(t, p.families, MetricBatches); v != 12 { // 1,200 rows in batches of 100
		t.Errorf("batches = %v", v)
	}
	if v := gaugeValue(t, p.families, MetricSuccess); v != 1 {
		t.Errorf("success = %v", v)
	}
	labels := p.families[MetricStoppedBy].GetMetric()[0].GetLabel()
	if len(labels) != 1 || labels[0].GetName() != "stopped_by" || labels[0].GetValue() != "done" {
		t.Errorf("stopped_by labels = %v", labels)
	}
	if v := gaugeValue(t, p.families, buildinfo.MetricName); v != 1 {
		t.Errorf("build_info = %v", v)
	}
}

func TestRunFailedRunPushesWithoutSuccessTimestamp(t *testing.T) {
	t.Parallel()
	gw := newGateway(t, http.StatusOK)
	dsn := storetest.DSNForRole(storetest.NewEmptyDatabase(t), janitorRole)
	sum, _, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": dsn, "PUSHGATEWAY_URL": gw.URL})
	if err == nil || sum.StoppedBy != "error" {
		t.Fatalf("summary %+v, err %v; want a failure", sum, err)
	}
	reqs := gw.requests()
	if len(reqs) != 1 {
		t.Fatalf("pushes = %d, want 1", len(reqs))
	}
	// POST keeps the previous success timestamp in the gateway's group.
	if reqs[0].method != http.MethodPost {
		t.Fatalf("failed run pushed with %s, want POST", reqs[0].method)
	}
	if _, ok := reqs[0].families[MetricLastSuccessTS]; ok {
		t.Fatal("a failed run pushed a success timestamp")
	}
	if v := gaugeValue(t, reqs[0].families, MetricSuccess); v != 0 {
		t.Fatalf("success = %v, want 0", v)
	}
}

func TestRunPushFailureFailsTheRun(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 10, 10)
	gw := newGateway(t, http.StatusInternalServerError)
	sum, _, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN, "PUSHGATEWAY_URL": gw.URL})
	if err == nil || !strings.Contains(err.Error(), "push metrics") {
		t.Fatalf("err = %v, want a push failure", err)
	}
	if sum.StoppedBy != "error" || sum.RowsDeleted != 10 || sum.Pushed {
		t.Fatalf("summary = %+v; the deletes stand, the run fails", sum)
	}
}

// A PUSHGATEWAY_URL with basic-auth user info and a token in its query
// authenticates with both, and when the gateway refuses, neither (nor the
// gateway's answer) reaches the error or the log: the status does.
func TestRunPushURLCredentials(t *testing.T) {
	t.Parallel()
	const user, password, token = "push-user-1", "push-pass-1", "push-token-1"
	for _, status := range []int{http.StatusOK, http.StatusUnauthorized} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			f.seed(t, 1, 10, 10)
			gw := newGateway(t, status)
			pushURL := strings.Replace(gw.URL, "://", "://"+user+":"+password+"@", 1) + "/?token=" + token
			sum, raw, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN, "PUSHGATEWAY_URL": pushURL})
			reqs := gw.requests()
			if len(reqs) != 1 {
				t.Fatalf("pushes = %d, want 1", len(reqs))
			}
			p := reqs[0]
			if p.user != user || p.password != password || p.query != "token="+token || p.path != "/metrics/job/"+PushJob {
				t.Fatalf("the gateway saw user %q password %q query %q path %q", p.user, p.password, p.query, p.path)
			}
			if status == http.StatusOK {
				if err != nil || !sum.Pushed || sum.StoppedBy != "done" {
					t.Fatalf("summary %+v, err %v", sum, err)
				}
				return
			}
			if !errors.Is(err, ErrPushRefused) || sum.StoppedBy != "error" || sum.Pushed {
				t.Fatalf("summary %+v, err %v; want ErrPushRefused", sum, err)
			}
			for _, out := range []string{err.Error(), raw} {
				if !strings.Contains(out, "401") {
					t.Errorf("the status is missing: %s", out)
				}
				for _, secret := range []string{user, password, token, gatewayAnswer} {
					if strings.Contains(out, secret) {
						t.Errorf("%q leaked: %s", secret, out)
					}
				}
			}
		})
	}
}

func TestRunCanceledBeforeStartIsACleanStop(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 100, 100)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	sum, _, err := runJanitor(t, ctx, map[string]string{"DATABASE_URL": f.janitorDSN})
	if err != nil {
		t.Fatalf("SIGTERM is not a failure: %v", err)
	}
	if sum.StoppedBy != "canceled" || sum.RowsDeleted != 0 {
		t.Fatalf("summary = %+v", sum)
	}
	if expired, _ := f.payloads(t); expired != 100 {
		t.Fatalf("expired payloads = %d, want 100", expired)
	}
}

// TestRunSIGTERMDuringADeleteRollsItBack blocks the janitor's DELETE on a row
// lock held by another session, then cancels the run as SIGTERM does: the
// statement is cancelled on the server, rolls back whole, and the run ends
// cleanly.
func TestRunSIGTERMDuringADeleteRollsItBack(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 10, 10)
	ctx := context.Background()
	tx, err := f.admin.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT 1 FROM inbound_payloads WHERE event_identity = sha256('e7'::bytea) FOR UPDATE`); err != nil {
		t.Fatal(err)
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		sum summaryLine
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, _, err := runJanitor(t, runCtx, map[string]string{"DATABASE_URL": f.janitorDSN})
		done <- result{sum, err}
	}()
	// Wait until the janitor's DELETE waits for the row lock: a condition,
	// not a sleep.
	waitCtx, waitCancel := context.WithTimeout(ctx, time.Minute)
	defer waitCancel()
	for {
		var waiting int
		err := f.admin.QueryRowContext(waitCtx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = 'retention-janitor' AND wait_event_type = 'Lock'`).Scan(&waiting)
		if err != nil {
			t.Fatalf("janitor never blocked on the row lock: %v", err)
		}
		if waiting == 1 {
			break
		}
		select {
		case <-waitCtx.Done():
		case <-time.After(10 * time.Millisecond): // poll interval, not an assertion
		}
	}
	cancel()
	r := <-done
	if r.err != nil {
		t.Fatalf("SIGTERM is a clean stop: %v", r.err)
	}
	if r.sum.StoppedBy != "canceled" || r.sum.RowsDeleted != 0 || r.sum.Batches != 0 {
		t.Fatalf("summary = %+v", r.sum)
	}
	if err := tx.Rollback(); err != nil {
		t.Fatal(err)
	}
	// The cancelled DELETE rolled back: all ten rows are still there.
	if expired, _ := f.payloads(t); expired != 10 {
		t.Fatalf("expired payloads = %d, want 10", expired)
	}
}

// TestRunDeletesExpiredOutboundBodies runs the janitor over inbound payloads
// and outbound bodies (§8.9): expired bodies go with their attempt rows, in
// batches of at most JANITOR_BATCH_SIZE, after the inbound payloads; a body
// whose message is in flight stays however expired; identities, messages,
// endpoints and sequences stay.
func TestRunDeletesExpiredOutboundBodies(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.seed(t, 1, 300, 100)
	f.seedOutbound(t, 1, 271, 250) // 250 expired, 20 live, 1 held
	before := f.snapshot(t)
	gw := newGateway(t, http.StatusOK)
	sum, raw, err := runJanitor(t, context.Background(), map[string]string{"DATABASE_URL": f.janitorDSN,
		"PUSHGATEWAY_URL": gw.URL, "JANITOR_BATCH_SIZE": "100"})
	if err != nil || sum.StoppedBy != "done" {
		t.Fatalf("run: %+v, %v\n%s", sum, err, raw)
	}
	// 500 attempt rows in 5 batches, then 250 bodies in 3.
	if sum.RowsDeleted != 100 || sum.OutboundBodies != 250 || sum.OutboundAttempts != 500 || sum.OutboundBatches != 8 {
		t.Fatalf("summary %+v, want 100 payloads, 250 bodies, 500 attempt rows in 8 batches", sum)
	}
	f.assertUntouched(t, before)
	if n := f.count(t, `SELECT count(*) FROM outbound_bodies`); n != 21 {
		t.Fatalf("%d bodies left, want the 20 live and the held one", n)
	}
	if n := f.count(t, `SELECT count(*) FROM outbox_attempts`); n != 42 {
		t.Fatalf("%d attempt rows left, want those of the 21 bodies left", n)
	}
	reqs := gw.requests()
	if len(reqs) != 1 {
		t.Fatalf("pushes = %d", len(reqs))
	}
	for name, want := range map[string]float64{MetricOutboundBodiesDeleted: 250, MetricOutboundAttemptsDeleted: 500,
		MetricOutboundBatches: 8, MetricRowsDeleted: 100} {
		if v := gaugeValue(t, reqs[0].families, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
}
