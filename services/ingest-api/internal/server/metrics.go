package server

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
)

// The policy label of limiter_refusals_total; with the "_limiter" suffix
// also the operation of a limiter's store_errors_total.
const (
	limiterPeer   = "peer"
	limiterSync   = "sync"
	limiterOutbox = "outbox"
)

// metrics never carry a tenant, account, device, key, token or event as a
// label: label values come only from route templates and closed code sets.
type metrics struct {
	requests       *prometheus.CounterVec
	envelopes      *prometheus.CounterVec
	duration       *prometheus.HistogramVec
	limiterRefused *prometheus.CounterVec
	storeErrors    *prometheus.CounterVec
	outbox         *prometheus.CounterVec
	commitSize     prometheus.Histogram
	commitDuration prometheus.Histogram
	// The outbox route's group commit (contract §8.6), apart from the
	// envelopes' so each keeps its own meaning.
	outboxCommitSize     prometheus.Histogram
	outboxCommitDuration prometheus.Histogram
	// bodyBudgetRefusals counts requests answered 503 because the in-flight
	// body budget was spent; the bytes held are a gauge read from the budget.
	bodyBudgetRefusals prometheus.Counter
}

// ingest-api's metrics are envelopeworker_ingest_*.
const namespace, subsystem = "envelopeworker", "ingest"

// metricOpts names one of ingest-api's counters or gauges.
func metricOpts(name, help string) prometheus.Opts {
	return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
}

func newMetrics(reg prometheus.Registerer, bodies *bodyBudget) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts(metricOpts("requests_total",
			"HTTP answers by route template, outcome and reason.")), []string{"route", "outcome", "reason"}),
		envelopes: prometheus.NewCounterVec(prometheus.CounterOpts(metricOpts("envelopes_total",
			"Envelope answers (single and batch items) by outcome and reason.")), []string{"outcome", "reason"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "request_duration_seconds",
			Help:    "HTTP request latency by route template.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route"}),
		limiterRefused: prometheus.NewCounterVec(prometheus.CounterOpts(metricOpts("limiter_refusals_total",
			"Requests or batch items refused by a rate limiter, by policy (peer, sync, outbox).")), []string{"policy"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts(metricOpts("store_errors_total",
			"Database operations that failed (answered 503), by operation.")), []string{"operation"}),
		outbox: prometheus.NewCounterVec(prometheus.CounterOpts(metricOpts("outbox_enqueues_total",
			"POST /v1/outbox answers that stored or repeated an envelope, by result (created, repeated).")), []string{"result"}),
		commitSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "group_commit_items",
			Help:    "Single-envelope requests committed per group-commit transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 100, 200, 500, 1000},
		}),
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "group_commit_duration_seconds",
			Help:    "Duration of group-commit transactions.",
			Buckets: prometheus.DefBuckets,
		}),
		outboxCommitSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "outbox_group_commit_items",
			Help:    "POST /v1/outbox requests committed per group-commit transaction.",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64, 100},
		}),
		outboxCommitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: subsystem, Name: "outbox_group_commit_duration_seconds",
			Help:    "Duration of outbox group-commit transactions.",
			Buckets: prometheus.DefBuckets,
		}),
		bodyBudgetRefusals: prometheus.NewCounter(prometheus.CounterOpts(metricOpts("inflight_body_refusals_total",
			"Requests answered 503 because INGEST_MAX_INFLIGHT_BODY_BYTES of request bodies were already held."))),
	}
	inflight := prometheus.NewGaugeFunc(prometheus.GaugeOpts(metricOpts("inflight_body_bytes",
		"Bytes of request-body buffers held at once (bounded by INGEST_MAX_INFLIGHT_BODY_BYTES).")), func() float64 { return float64(bodies.held.Load()) })
	reg.MustRegister(m.requests, m.envelopes, m.duration, m.limiterRefused, m.storeErrors, m.outbox, m.commitSize, m.commitDuration,
		m.outboxCommitSize, m.outboxCommitDuration, m.bodyBudgetRefusals, inflight)
	return m
}

// NewRegistry is a private registry with Go runtime and process collectors,
// so two servers in one process (tests) never share series.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), buildinfo.Get().Collector())
	return reg
}
