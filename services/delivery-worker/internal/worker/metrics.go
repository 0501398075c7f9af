package worker

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/services/delivery-worker/internal/sender"
)

// Metrics of the worker. Labels come only from closed sets (verdict, stable
// error code, operation); never a tenant, endpoint, message or URL.
type Metrics struct {
	attempts       *prometheus.CounterVec
	latency        *prometheus.HistogramVec
	due            prometheus.Gauge
	oldestDueAge   prometheus.Gauge
	leaseExpiries  prometheus.Counter
	fenced         prometheus.Counter
	claims         prometheus.Counter
	claimed        prometheus.Histogram
	settleBatch    prometheus.Histogram
	limiterRefused prometheus.Counter
	tenantCapped   prometheus.Counter
	storeErrors    *prometheus.CounterVec
	inFlight       prometheus.Gauge
	secretReloads  *prometheus.CounterVec
}

// The worker's metrics are envelopeworker_delivery_*.
const namespace, subsystem = "envelopeworker", "delivery"

// metricOpts names one of the worker's counters or gauges.
func metricOpts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
}

// NewMetrics registers the worker's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts(metricOpts("attempts_total",
			"Delivery attempts by result (delivered, retry, dead, aborted, lease_lost) and stable error code.")), []string{"result", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "attempt_duration_seconds",
			Help:    "Duration of one delivery attempt (signing and the HTTP request), by result.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"result"}),
		due: prometheus.NewGauge(prometheus.GaugeOpts(metricOpts("due_messages",
			"Claimable outbox messages across all tenants (sampled)."))),
		oldestDueAge: prometheus.NewGauge(prometheus.GaugeOpts(metricOpts("oldest_due_age_seconds",
			"How long the longest-waiting claimable message has been due (sampled)."))),
		leaseExpiries: prometheus.NewCounter(prometheus.CounterOpts(metricOpts("lease_expiries_total",
			"Claimed attempts this worker did not settle because their lease deadline passed (or shutdown cut them off); the message becomes claimable again when the lease expires."))),
		fenced: prometheus.NewCounter(prometheus.CounterOpts(metricOpts("fenced_settles_total",
			"Settles the store refused because the attempt no longer owned the message."))),
		claims: prometheus.NewCounter(prometheus.CounterOpts(metricOpts("claims_total",
			"Claim statements run."))),
		settleBatch: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "settle_batch_size",
			Help:    "Settlements per database commit (settles are group-committed).",
			Buckets: []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000},
		}),
		claimed: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "claimed_messages",
			Help:    "Messages returned per claim.",
			Buckets: []float64{0, 1, 2, 5, 10, 20, 50, 100},
		}),
		limiterRefused: prometheus.NewCounter(prometheus.CounterOpts(metricOpts("limiter_refusals_total",
			"Claims skipped because the tenant's delivery limiter had no token."))),
		tenantCapped: prometheus.NewCounter(prometheus.CounterOpts(metricOpts("tenant_share_skips_total",
			"Claims skipped because the tenant already held DELIVERY_TENANT_MAX_INFLIGHT attempts of this worker."))),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts(metricOpts("store_errors_total",
			"Failed database operations by operation.")), []string{"operation"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts(metricOpts("in_flight_attempts",
			"Attempts running now."))),
		secretReloads: prometheus.NewCounterVec(prometheus.CounterOpts(metricOpts("secret_reloads_total",
			"Reloads of a changed secrets file by result (ok, refused).")), []string{"result"}),
	}
	reg.MustRegister(m.attempts, m.latency, m.due, m.oldestDueAge, m.leaseExpiries, m.fenced, m.claims,
		m.claimed, m.settleBatch, m.limiterRefused, m.tenantCapped, m.storeErrors, m.inFlight, m.secretReloads)
	// Series that exist from the start: rate() and increase() need a zero
	// before the first event to see it, and dashboards and alerts (and the
	// k8s module's test that scrapes this binary) find the families before
	// any delivery. Label values with unbounded or rare sets stay lazy.
	m.attempts.WithLabelValues(sender.Delivered.String(), "")
	for _, v := range []sender.Verdict{sender.Delivered, sender.Retry, sender.Dead} {
		m.latency.WithLabelValues(v.String())
	}
	m.secretReloads.WithLabelValues("ok")
	m.secretReloads.WithLabelValues("refused")
	return m
}

// SecretReload records a secrets file reload outcome (a secrets.Watcher
// OnReload hook).
func (m *Metrics) SecretReload(ok bool) {
	if ok {
		m.secretReloads.WithLabelValues("ok").Inc()
	} else {
		m.secretReloads.WithLabelValues("refused").Inc()
	}
}

// NewRegistry is a private registry with the Go runtime and process
// collectors, so two workers in one process (tests) never share series.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Get().Collector())
	return reg
}
