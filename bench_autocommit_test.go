package otelpgxtx

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// benchAutocommitStatement is one autocommit statement: sent on the pool, outside any
// transaction, with key.
type benchAutocommitStatement struct {
	name string
	run  func(ctx context.Context, pool *pgxpool.Pool, key int64) error
}

var benchAutocommitStatements = []benchAutocommitStatement{
	{"insert", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
		_, err := pool.Exec(ctx, "insert into bench_log (k, v) values ($1, $2)", key, key)
		return err
	}},
	{"call", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
		_, err := pool.Exec(ctx, "call bench_call($1, $2)", key, key)
		return err
	}},
	{"select", func(ctx context.Context, pool *pgxpool.Pool, key int64) error {
		var v int64
		return pool.QueryRow(ctx, "select v from bench_kv where k = $1", key).Scan(&v)
	}},
}

// benchAutocommitVariants: bare pgx, otelpgx alone, the Tracer with its defaults, and
// with the xid or the marker after an INSERT, before its Sync (their price per write:
// server-µs/op; a SELECT, no implicit transaction, carries nothing), and with no implicit
// transaction made a frame (k: c's price less the frame's).
var benchAutocommitVariants = []string{benchA, benchB, benchC, benchG, benchH, benchK}

// benchAutocommitDB is one variant's pool of one connection on the test server, warm.
type benchAutocommitDB struct {
	*benchDB
	stmt benchAutocommitStatement
	key  int64
}

func newBenchAutocommitDB(b *testing.B, v string, s benchSampling, stmt benchAutocommitStatement) *benchAutocommitDB {
	cfg, err := pgxpool.ParseConfig(srv.ConnString())
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 1
	d := &benchAutocommitDB{benchDB: &benchDB{v: v}, stmt: stmt}
	d.tel = benchInstrument(b, cfg.ConnConfig, cfg, v, s)
	if d.pool, err = pgxpool.NewWithConfig(context.Background(), cfg); err != nil {
		b.Fatal(err)
	}
	for range 16 { // warm: the statement prepared and cached, the cluster identity read
		if err := d.statement(context.Background()); err != nil {
			d.close()
			b.Fatal(err)
		}
	}
	c, err := d.pool.Acquire(context.Background())
	if err != nil {
		d.close()
		b.Fatal(err)
	}
	d.pids = []uint32{c.Conn().PgConn().PID()}
	c.Release()
	return d
}

// statement sends the statement once, under the application's request span.
func (d *benchAutocommitDB) statement(ctx context.Context) error {
	ctx, span := d.tel.request(ctx)
	defer span.End()
	d.key++
	return d.stmt.run(ctx, d.pool, benchKey(0, int(d.key)))
}

// BenchmarkAutocommit sends one autocommit statement at a time on a pool of one
// connection (BenchmarkAutocommit/<statement>/<sampling>/v=<variant>) and reports, next to
// ns/op and allocs/op, the client's CPU time per statement (cpu-ns/op, this process's:
// pgx, the instrumentation, the SDK, the runtime) and the server backend's (server-µs/op).
func BenchmarkAutocommit(b *testing.B) {
	admin := benchSchema(b)
	for _, stmt := range benchAutocommitStatements {
		for _, s := range benchSamplings {
			for _, v := range benchAutocommitVariants {
				var d *benchAutocommitDB
				b.Run(stmt.name+"/"+s.name+"/v="+v, func(b *testing.B) {
					if d == nil { // created on the first call, reused by the following ones
						d = newBenchAutocommitDB(b, v, s, stmt)
					}
					benchReset(b, admin)
					d.tel.flushed()
					spans := d.tel.spanCount()
					ctx := context.Background()
					server := d.cpu(b).server
					b.ReportAllocs()
					benchLoopCPU(b, func() {
						if err := d.statement(ctx); err != nil {
							b.Fatal(err)
						}
					})
					b.StopTimer()
					b.ReportMetric(float64(d.cpu(b).server-server)/1e3/float64(b.N), "server-µs/op")
					b.ReportMetric(float64(d.tel.spanCount()-spans)/float64(b.N), "spans/op")
				})
				if d != nil {
					d.close()
				}
			}
		}
	}
}

// benchAutocommitPairs: the Tracer against otelpgx alone, with and without implicit
// frames (k), the frame's own price (c against k), and the null pair.
var benchAutocommitPairs = [][2]string{{benchB, benchC}, {benchB, benchK}, {benchK, benchC}, {benchC, benchC}}

// BenchmarkAutocommitPair is BenchmarkAutocommit's c against b (and c against itself, the
// measure's noise) paired in time as BenchmarkHookPair pairs its sides: blocks of
// statements of each, alternating, with both sides' spans flushed and the heap collected
// outside the blocks; the median difference per statement, wall (Δns/tx) and process CPU
// (Δcpu-ns/tx), is reported.
func BenchmarkAutocommitPair(b *testing.B) {
	admin := benchSchema(b)
	for _, stmt := range benchAutocommitStatements {
		for _, s := range benchSamplings {
			for _, p := range benchAutocommitPairs {
				b.Run(stmt.name+"/"+s.name+"/v="+p[1]+"-"+p[0], func(b *testing.B) {
					benchReset(b, admin)
					base, head := newBenchAutocommitSide(b, p[0], s, stmt), newBenchAutocommitSide(b, p[1], s, stmt)
					defer base.close()
					defer head.close()
					benchPair(b, base, head)
				})
			}
		}
	}
}

// benchAutocommitBlock is how many statements one side of a BenchmarkAutocommitPair
// sample sends: some 2 ms of work.
const benchAutocommitBlock = 64

func newBenchAutocommitSide(b *testing.B, v string, s benchSampling, stmt benchAutocommitStatement) benchPairSide {
	d := newBenchAutocommitDB(b, v, s, stmt)
	return benchPairSide{
		block: benchAutocommitBlock,
		run:   func() error { return d.statement(context.Background()) },
		quiet: func() { d.tel.flushed() },
		close: d.close,
	}
}
