package janitor

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/push"

	"github.com/envelopeworker/envelopeworker/modules/buildinfo"
	"github.com/envelopeworker/envelopeworker/modules/redact"
	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/config"
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
	// Outbound retention (§8.9).
	MetricOutboundBodiesDeleted   = "envelopeworker_janitor_last_run_outbound_bodies_deleted"
	MetricOutboundAttemptsDeleted = "envelopeworker_janitor_last_run_outbound_attempts_deleted"
	MetricOutboundBatches         = "envelopeworker_janitor_last_run_outbound_batches"
)

// registry builds a private registry holding the run's figures. The success
// timestamp is included only for a successful run (see pushMetrics).
func registry(s Summary, failed bool, end time.Time) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	// Pushed with every run, success or not, so the gateway shows which
	// build ran last.
	reg.MustRegister(buildinfo.Get().Collector())
	gauge := func(name, help string, v float64) {
		g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
		g.Set(v)
		reg.MustRegister(g)
	}
	gauge(MetricRowsDeleted, "Expired payload rows deleted by the last run.", float64(s.RowsDeleted))
	gauge(MetricBatches, "DELETE batches that removed rows in the last run.", float64(s.Batches))
	gauge(MetricOutboundBodiesDeleted, "Expired outbound envelope bodies deleted by the last run.", float64(s.OutboundBodiesDeleted))
	gauge(MetricOutboundAttemptsDeleted, "Delivery attempt rows of expired outbound envelopes deleted by the last run.", float64(s.OutboundAttemptsDeleted))
	gauge(MetricOutboundBatches, "Outbound DELETE batches that removed rows in the last run.", float64(s.OutboundBatches))
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

// ErrPushRefused marks a push the gateway answered with a status other than
// 200 or 202.
var ErrPushRefused = errors.New("the gateway refused the push")

// pushMetrics sends the run's figures. A success replaces the job's group
// (PUT); a failure only replaces the metrics it carries (POST), leaving the
// last success timestamp of an earlier run in place for alerting.
//
// PUSHGATEWAY_URL may carry basic-auth credentials and a token in its query.
// The push package writes its URL into its errors, followed by the gateway's
// answer, and net/http writes the request URL into its own; so the push
// package gets the URL without user info and query, the user info goes in as
// BasicAuth, pushTransport adds the query to the request, and the errors
// returned here name the URL through redact.URL and never carry the gateway's
// answer, only its status.
func pushMetrics(ctx context.Context, rawURL string, timeout time.Duration, s Summary, failed bool, end time.Time) error {
	shown := redact.URL(rawURL)
	u, err := url.Parse(rawURL)
	if err != nil {
		return fmt.Errorf("push metrics to %s: %w: PUSHGATEWAY_URL does not parse", shown, config.ErrInvalid)
	}
	rt := &pushTransport{base: http.DefaultTransport, query: u.RawQuery}
	base := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	p := push.New(base.String(), PushJob).
		Gatherer(registry(s, failed, end)).
		Client(&http.Client{
			Transport: rt,
			Timeout:   timeout,
			// A redirect would take the query's token and the gateway's
			// status elsewhere; a Pushgateway answers without one.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		})
	if u.User != nil {
		pass, _ := u.User.Password()
		p = p.BasicAuth(u.User.Username(), pass)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if failed {
		err = p.AddContext(ctx)
	} else {
		err = p.PushContext(ctx)
	}
	switch {
	case err == nil:
		return nil
	case rt.status != 0 && rt.status != http.StatusOK && rt.status != http.StatusAccepted:
		return fmt.Errorf("push metrics to %s: %w: %d %s", shown, ErrPushRefused, rt.status, http.StatusText(rt.status))
	default:
		// No answer (or none the push package accepted): its error names
		// only the base URL, which holds no credential.
		return fmt.Errorf("push metrics to %s: %w", shown, err)
	}
}

// pushTransport puts PUSHGATEWAY_URL's query on the push request and keeps
// the status the gateway answered.
type pushTransport struct {
	base   http.RoundTripper
	query  string
	status int
}

func (t *pushTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.query != "" {
		req = req.Clone(req.Context())
		req.URL.RawQuery = t.query // the push package's URL has none
	}
	resp, err := t.base.RoundTrip(req)
	if err == nil {
		t.status = resp.StatusCode
	}
	return resp, err
}
