//go:build soak

package otelpgxtx

// The soak's faults (see soak_test.go): the nemesis terminates backends, kills one with
// SIGKILL as the OOM killer does (the postmaster recovers in place), arms proxy cuts and
// crashes, restarts or fails over the server; the SyncRep watcher ends every
// synchronous-replication wait; waitQuiet waits for the workload's backends to finish.

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// soakAdmin is an admin connection that reconnects after the server was restarted.
type soakAdmin struct {
	dial func(context.Context) (*pgx.Conn, error)
	c    *pgx.Conn
}

// dial opens an admin connection to the primary.
func (s *soak) dial(ctx context.Context) (*pgx.Conn, error) {
	if s.cluster != nil {
		return pgx.Connect(ctx, s.cluster.ConnString())
	}
	return srv.Conn(ctx)
}

func (a *soakAdmin) get(ctx context.Context) (*pgx.Conn, error) {
	if a.c != nil && !a.c.IsClosed() {
		return a.c, nil
	}
	c, err := a.dial(ctx)
	if err != nil {
		return nil, err
	}
	a.c = c
	return c, nil
}

// close closes the connection, if any; the next get dials again.
func (a *soakAdmin) close() {
	if a.c != nil {
		_ = a.c.Close(context.Background())
		a.c = nil
	}
}

// soakPids returns the workload's backends matching the condition.
func soakPids(ctx context.Context, a *soakAdmin, where string) ([]uint32, error) {
	c, err := a.get(ctx)
	if err != nil {
		return nil, err
	}
	rows, err := c.Query(ctx, "select pid from pg_stat_activity where application_name = '"+soakAppName+"' and "+where)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (uint32, error) {
		var pid int32
		err := r.Scan(&pid)
		return uint32(pid), err
	})
}

func soakSignal(ctx context.Context, a *soakAdmin, fn string, pid uint32) bool {
	c, err := a.get(ctx)
	if err != nil {
		return false
	}
	var ok bool
	if err := c.QueryRow(ctx, "select "+fn+"($1)", int32(pid)).Scan(&ok); err != nil {
		return false
	}
	return ok
}

// watchSyncRep ends every SyncRep wait of the workload (the phantom standby never
// connects): by terminating the backend, by cancelling the wait (the commit completes
// with a warning), or by cancelling the client's context (the client gives up; the
// backend, orphaned, is then ended on a later round). A COMMIT under a client deadline
// is left alone while its client waits: the deadline ends it.
func (s *soak) watchSyncRep(ctx context.Context, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(s.cfg.seed, 1<<20))
	a := soakAdmin{dial: s.dial}
	defer a.close()
	acted := map[uint32]time.Time{}
	tick := time.NewTicker(3 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		pids, err := soakPids(ctx, &a, "wait_event = 'SyncRep'")
		if err != nil {
			a.close()
			continue // the server is down, or restarting
		}
		now := time.Now()
		for _, pid := range pids {
			if at, ok := acted[pid]; ok && now.Sub(at) < 250*time.Millisecond {
				continue // already signalled; it takes a moment to leave the wait
			}
			w, registered := s.waiter(pid)
			if registered && w.deadline {
				continue
			}
			choices := 2
			if registered {
				choices = 3
			}
			switch rng.IntN(choices) {
			case 0:
				if soakSignal(ctx, &a, "pg_terminate_backend", pid) {
					s.faults.add("syncrep: backend terminated", 1)
				}
			case 1:
				if soakSignal(ctx, &a, "pg_cancel_backend", pid) {
					s.faults.add("syncrep: wait cancelled (pg_cancel_backend)", 1)
				}
			case 2:
				w.cancel()
				s.faults.add("syncrep: client context cancelled during COMMIT", 1)
			}
			acted[pid] = now
		}
		for pid, at := range acted {
			if now.Sub(at) > time.Second {
				delete(acted, pid)
			}
		}
	}
}

// nemesis injects faults at random moments until stopped, out of budget or out of time.
// It always returns with the server running.
func (s *soak) nemesis(ctx context.Context, stop <-chan struct{}) {
	rng := rand.New(rand.NewPCG(s.cfg.seed, 1<<21))
	a := soakAdmin{dial: s.dial}
	defer a.close()
	// Crashes happen when the workload crosses random points of its progress, so that
	// every run has them whatever its speed.
	crashAt := make([]int64, s.cfg.crashes)
	for i := range crashAt {
		crashAt[i] = int64(float64(s.cfg.tx) * (0.1 + 0.8*rng.Float64()))
	}
	slices.Sort(crashAt)
	deadline := time.Now().Add(s.cfg.duration)
	for faults := 0; faults < s.cfg.maxFaults+s.cfg.crashes; {
		wait := time.Duration(rng.ExpFloat64() * float64(s.cfg.faultEvery))
		if !soakPause(ctx, stop, wait) {
			return
		}
		if s.cfg.duration > 0 && time.Now().After(deadline) {
			return
		}
		if len(crashAt) > 0 && s.done.Load() >= crashAt[0] {
			crashAt = crashAt[1:]
			a.close()
			s.crash(ctx, rng)
			faults++
			continue
		}
		if faults >= s.cfg.maxFaults {
			continue // only crashes are left
		}
		// terminate ends one backend in the given state, if any; a failed lookup drops the
		// admin connection, to be dialled again.
		terminate := func(where, fault string) {
			pids, err := soakPids(ctx, &a, where)
			if err != nil {
				a.close()
				return
			}
			if len(pids) > 0 && soakSignal(ctx, &a, "pg_terminate_backend", pids[rng.IntN(len(pids))]) {
				s.faults.add(fault, 1)
				faults++
			}
		}
		switch r := rng.IntN(100); {
		case r < 33:
			terminate("state = 'idle in transaction'", "terminate: idle in transaction")
		case r < 43:
			terminate("state = 'active' and wait_event is distinct from 'SyncRep'", "terminate: active backend")
		case r < 45:
			if s.killBackend(ctx, &a, rng) {
				faults++
			}
		case r < 70:
			s.proxy.CutAfterCommit()
			s.faults.add("proxy: cut after COMMIT (armed)", 1)
			faults++
		case r < 95:
			s.proxy.CutBeforeCommit()
			s.faults.add("proxy: cut before COMMIT (armed)", 1)
			faults++
		default:
			s.proxy.CutAll()
			s.faults.add("proxy: cut all connections", 1)
			faults++
		}
	}
	// Out of budget: the remaining crashes still happen, when their moment comes.
	for len(crashAt) > 0 {
		if !soakPause(ctx, stop, s.cfg.faultEvery) {
			return
		}
		if s.done.Load() >= crashAt[0] {
			crashAt = crashAt[1:]
			s.crash(ctx, rng)
		}
	}
}

// killBackend kills a random backend of the workload that is not idle (active, in its
// synchronous-replication wait, idle in a transaction) with SIGKILL, as the kernel's OOM
// killer does, and waits for the crash recovery that follows: the postmaster keeps its
// start time and timeline, and hands out again the xids whose records were lost.
func (s *soak) killBackend(ctx context.Context, a *soakAdmin, rng *rand.Rand) bool {
	pids, err := soakPids(ctx, a, "state <> 'idle'")
	a.close() // the recovery ends it
	if err != nil || len(pids) == 0 {
		return false
	}
	target := srv
	if s.cluster != nil {
		target = s.cluster.Primary()
	}
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	if err := target.KillBackend(kctx, pids[rng.IntN(len(pids))]); err != nil {
		if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, syscall.ESRCH) {
			s.errs.add("KillBackend: "+err.Error(), 1)
		} // else the backend exited since it was listed: nothing was killed
		return false
	}
	s.faults.add("SIGKILL: application backend (crash recovery in place)", 1)
	return true
}

// soakPause waits d, and reports false if stop closed or ctx ended first.
func soakPause(ctx context.Context, stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-stop:
		return false
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// crash stops the server like a power cut and restarts it after a short random downtime;
// on a cluster every other event is a failover instead.
func (s *soak) crash(ctx context.Context, rng *rand.Rand) {
	target := srv
	if s.cluster != nil {
		s.events++
		switch s.events % 3 {
		case 1:
			if err := s.cluster.Failover(context.WithoutCancel(ctx)); err != nil {
				s.errs.add("Failover: "+err.Error(), 1)
				return
			}
			s.faults.add("cluster: failover (crash primary, promote standby, pg_rewind old primary)", 1)
			return
		case 0:
			// Longer than the reconcile wait: replication barriers give up meanwhile.
			if err := s.cluster.Standby().StopImmediate(); err != nil {
				s.errs.add("standby StopImmediate: "+err.Error(), 1)
				return
			}
			s.faults.add("cluster: standby down for 2.5-3.5 s (commits wait, barriers give up)", 1)
			soakThink(ctx, time.Duration(2500+rng.IntN(1000))*time.Millisecond)
			if err := s.cluster.ResumeStandby(context.WithoutCancel(ctx)); err != nil {
				s.errs.add("ResumeStandby: "+err.Error(), 1)
			}
			return
		}
		target = s.cluster.Primary()
	}
	if err := target.StopImmediate(); err != nil {
		s.errs.add("StopImmediate: "+err.Error(), 1)
		return
	}
	s.faults.add("server: stop -m immediate + restart", 1)
	soakThink(ctx, time.Duration(50+rng.IntN(250))*time.Millisecond) // downtime: transactions fail
	if err := target.Restart(context.WithoutCancel(ctx)); err != nil {
		s.errs.add("Restart: "+err.Error(), 1)
	}
}

// waitQuiet waits until no backend of the workload is doing anything: orphaned backends
// (their client cut or gone) have finished, and the watcher has ended every SyncRep wait.
func (s *soak) waitQuiet(ctx context.Context) {
	a := soakAdmin{dial: s.dial}
	defer a.close()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		pids, err := soakPids(ctx, &a, "state <> 'idle'")
		if err == nil && len(pids) == 0 {
			return
		}
		if err != nil {
			a.close()
		}
		select {
		case <-ctx.Done():
			s.t.Fatalf("the workload's backends never went quiet: %v %v", pids, err)
		case <-tick.C:
		}
	}
}
