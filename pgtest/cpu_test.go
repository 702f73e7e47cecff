package pgtest

import (
	"testing"
	"time"
)

// TestBackendCPU reads the CPU time of the backend serving a connection, by the PID
// pgconn got from the server, before and after a query that keeps it busy.
func TestBackendCPU(t *testing.T) {
	LeakCheck(t)
	ctx := ContextFor(t)
	c, err := srv.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	var pid uint32
	if err := c.QueryRow(ctx, "select pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if pid != c.PgConn().PID() {
		t.Fatalf("pg_backend_pid() = %d, pgconn's PID = %d", pid, c.PgConn().PID())
	}
	read := map[string]func(uint32) (time.Duration, error){"BackendCPU": BackendCPU, "schedstat": schedstatCPU, "stat": statCPU}
	before := map[string]time.Duration{}
	for name, fn := range read {
		if before[name], err = fn(pid); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
	// Enough work for several of stat's 10 ms ticks even on a fast machine.
	if _, err := c.Exec(ctx, "select count(*) from generate_series(1, 5000000)"); err != nil {
		t.Fatal(err)
	}
	for name, fn := range read {
		after, err := fn(pid)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if after <= before[name] {
			t.Errorf("%s: CPU time %v after the query, %v before", name, after, before[name])
		}
	}
	if _, err := BackendCPU(1 << 30); err == nil {
		t.Error("BackendCPU of a process that does not exist: no error")
	}
}
