package janitor

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/envelopeworker/envelopeworker/modules/store/storetest"
	"github.com/envelopeworker/envelopeworker/services/retention-janitor/internal/config"
)

// BenchmarkDeleteExpired100k measures one janitor cycle over 100,000 expired
// payloads (of about 20 bytes each, so the figure is index and WAL work, not
// payload size), unpaced, in batches of 100 (the default) and of 1,000 (the
// contract's bound), as the janitor role, with durable commits. Seeding is
// outside the timer. Reported: payload rows/s.
func BenchmarkDeleteExpired100k(b *testing.B) {
	for _, batch := range []int{config.DefaultBatchSize, 1000} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) { benchmarkDeleteExpired(b, batch) })
	}
}

func benchmarkDeleteExpired(b *testing.B, batch int) {
	const rows = 100_000
	f := newFixture(b)
	storetest.Durable(b, f.adminDSN)
	st := storetest.Open(b, f.janitorDSN)
	var deleted int64
	var elapsed time.Duration
	next := int64(1)
	for b.Loop() {
		b.StopTimer()
		f.seed(b, next, next+rows-1, rows)
		next += rows
		f.exec(b, `VACUUM ANALYZE inbound_payloads`)
		b.StartTimer()
		start := time.Now()
		sum, err := Sweep(context.Background(), st.Retention(), time.Now(), Pace{Batch: batch})
		elapsed += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if sum.RowsDeleted != rows {
			b.Fatalf("deleted %d, want %d", sum.RowsDeleted, rows)
		}
		deleted += sum.RowsDeleted
	}
	b.ReportMetric(float64(deleted)/elapsed.Seconds(), "rows/s")
}
