package janitor

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"
)

// PushJob is the Pushgateway job label of every janitor push.
const PushJob = "envelopeworker_retention_janitor"

// Metric names pushed to the Pushgateway. They describe the last run, so they
// are gauges; stopped_by is the only label and has five values.
const (
	MetricRowsDeleted   = "envelopeworker_janitor_last_run_rows_deleted"
	MetricBatches       = "envelopeworker_janitor_last_run_batches"
	MetricDuration      = "envelopeworker_janitor_last_run_duration_seconds"
	MetricSuccess       = "envelopeworker_janitor_last_run_success"
	MetricStoppedBy     = "envelopeworker_janitor_last_run_stopped_by"
	MetricRunTimestamp  = "envelopeworker_janitor_last_run_timestamp_seconds"
	MetricLastSuccessTS = "envelopeworker_janitor_last_success_timestamp_seconds"
)

// registry builds a private registry holding the run's figures. The success
// timestamp is included only for a successful run (see pushMetrics).
func registry(s Summary, failed bool, end time.Time) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	gauge := func(name, help string, v float64) {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		g.Set(v)
		reg.MustRegister(g)
	}
	gauge(MetricRowsDeleted, "Expired payload rows deleted by the last run.", float64(s.RowsDeleted))
	gauge(MetricBatches, "DELETE batches that removed rows in the last run.", float64(s.Batches))
	gauge(MetricDuration, "Wall time of the last run.", s.Duration.Seconds())
	gauge(MetricRunTimestamp, "Unix time the last run ended.", float64(end.UnixNano())/1e9)
	success := 1.0
	if failed {
		success = 0
	} else {
		gauge(MetricLastSuccessTS, "Unix time the last successful run ended.", float64(end.UnixNano())/1e9)
	}
	gauge(MetricSuccess, "1 if the last run succeeded, else 0.", success)
	stopped := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: MetricStoppedBy, Help: "1 for the reason the last run stopped."}, []string{"stopped_by"})
	stopped.WithLabelValues(string(s.StoppedBy)).Set(1)
	reg.MustRegister(stopped)
	return reg
}

// pushMetrics sends the run's figures. A success replaces the job's group
// (PUT); a failure only replaces the metrics it carries (POST), leaving the
// last success timestamp of an earlier run in place for alerting.
func pushMetrics(ctx context.Context, url string, timeout time.Duration, s Summary, failed bool, end time.Time) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	p := push.New(url, PushJob).
		Gatherer(registry(s, failed, end)).
		Client(&http.Client{Timeout: timeout})
	var err error
	if failed {
		err = p.AddContext(ctx)
	} else {
		err = p.PushContext(ctx)
	}
	if err != nil {
		return fmt.Errorf("push metrics: %w", err)
	}
	return nil
}
