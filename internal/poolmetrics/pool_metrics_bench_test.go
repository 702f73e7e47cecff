package poolmetrics

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/txevidence/otelpgxtx/internal/settings"
)

// BenchmarkPoolMetrics is what the connection-pool metrics cost per acquire and release of
// a pool's connection, without pgxpool: v=hooks is what the hooks run (AcquireStart,
// AcquireEnd, Release: the pending count, three clock reads, the start carried in the
// context, the wait time and the use time), v=sdk_floor the SDK alone recording those two
// histogram data points on the pool's attribute set (five attributes: the pool's name and
// its database identity), and v=sdk_record one of them. hooks − sdk_floor is the library's
// own part.
func BenchmarkPoolMetrics(b *testing.B) {
	cfg, err := pgxpool.ParseConfig("postgres://bench@db.example:5432/bench")
	if err != nil {
		b.Fatal(err)
	}
	pm := New(settings.Config{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))}, cfg)
	defer pm.Close()
	ctx := context.Background()
	b.Run("v=hooks", func(b *testing.B) {
		var st ConnState
		b.ReportAllocs()
		for b.Loop() {
			pm.AcquireEnd(pm.AcquireStart(ctx), nil, &st, nil)
			pm.Release(&st)
		}
	})
	b.Run("v=sdk_floor", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pm.waitTime.Record(ctx, 1e-6, pm.recordOpts...)
			pm.useTime.Record(ctx, 1e-5, pm.recordOpts...)
		}
	})
	b.Run("v=sdk_record", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pm.waitTime.Record(ctx, 1e-6, pm.recordOpts...)
		}
	})
}
