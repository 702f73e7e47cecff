package pgtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// waitEventPoll is how often WaitForWaitEvent samples pg_stat_activity;
// short, because tests wait on it in their critical path.
const waitEventPoll = 2 * time.Millisecond

// withConn runs fn on a fresh admin connection, so the helpers never share
// session state with the connections under test.
func (s *Server) withConn(ctx context.Context, fn func(*pgx.Conn) error) error {
	c, err := s.Conn(ctx)
	if err != nil {
		return err
	}
	return errors.Join(fn(c), c.Close(context.WithoutCancel(ctx)))
}

// Terminate ends the backend with pg_terminate_backend. It returns an error
// if PostgreSQL reports false (no such backend). It does not wait for the
// backend to exit.
func (s *Server) Terminate(ctx context.Context, pid uint32) error {
	return s.signalBackend(ctx, "pg_terminate_backend", pid)
}

// KillBackend kills the backend pid with SIGKILL, as the kernel's OOM killer does, and
// returns once the server has recovered from it and accepts connections again. The
// postmaster, with restart_after_crash on (the default), ends every other backend,
// reinitializes shared memory and replays WAL in place: it keeps its start time and
// timeline, every connection to the server is lost, and the WAL no one had flushed is
// gone. Recovery is told by its checkpointer, which the postmaster starts afresh. A
// backend that exits by itself first is not killed: the error then wraps os.ErrNotExist.
// Linux only (it reads /proc).
func (s *Server) KillBackend(ctx context.Context, pid uint32) error {
	before, err := s.checkpointerPID(ctx)
	if err != nil {
		return err
	}
	// We may be root: a PID that is no longer a backend's may be anyone's.
	if _, err := s.backendState(pid); err != nil {
		return err
	}
	// Stopped first, the backend cannot exit by itself meanwhile, so the SIGKILL is what
	// ends it (a process that already exited would take it without a crash).
	if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
		return fmt.Errorf("pgtest: SIGSTOP to backend %d: %w", pid, err)
	}
	tick := time.NewTicker(waitEventPoll)
	defer tick.Stop()
	for {
		state, err := s.backendState(pid)
		if err != nil {
			return err
		}
		if state == 'T' || state == 't' {
			break
		}
		select {
		case <-ctx.Done():
			_ = syscall.Kill(int(pid), syscall.SIGCONT) // left as it was
			return fmt.Errorf("pgtest: backend %d did not stop (state %c): %w", pid, state, ctx.Err())
		case <-tick.C:
		}
	}
	if err := syscall.Kill(int(pid), syscall.SIGKILL); err != nil {
		return fmt.Errorf("pgtest: SIGKILL to backend %d: %w", pid, err)
	}
	if err := s.resumeHeldAfterQuit(ctx); err != nil {
		return err
	}
	for {
		// Until the postmaster notices, a connection may still reach the old incarnation;
		// during recovery it is refused.
		now, err := s.checkpointerPID(ctx)
		if err == nil && now != before {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: waiting for the server to recover from SIGKILL of backend %d (last: %v): %w\nserver log (%s) ends with:\n%s",
				pid, err, ctx.Err(), s.logFile, s.logTail(20))
		case <-tick.C:
		}
	}
}

// HoldBackgroundWriters stops (SIGSTOP) the server's WAL writer, background writer and
// checkpointer until the crash recovery of KillBackend ends them, or until release: in
// between no WAL is written to disk but by the backends' own commits — no WAL writer
// cycle, no running-transactions record (which the background writer logs every 15 s and
// has the WAL writer flush), no checkpoint —, so that a test knows which records a kill
// loses. Release is idempotent; call it when the test ends.
func (s *Server) HoldBackgroundWriters(ctx context.Context) (release func(), err error) {
	var pids []int64
	err = s.withConn(ctx, func(c *pgx.Conn) error {
		rows, err := c.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE backend_type IN ('walwriter', 'background writer', 'checkpointer')")
		if err != nil {
			return err
		}
		pids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
		return err
	})
	if err == nil && len(pids) != 3 {
		err = fmt.Errorf("pgtest: found %d of the WAL writer, background writer and checkpointer", len(pids))
	}
	if err != nil {
		return func() {}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pid := range pids {
		if err := syscall.Kill(int(pid), syscall.SIGSTOP); err != nil {
			s.resumeHeld()
			return func() {}, fmt.Errorf("pgtest: SIGSTOP to %d: %w", pid, err)
		}
		s.held = append(s.held, int(pid))
	}
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.resumeHeld()
	}, nil
}

// resumeHeld continues the held processes (s.mu held).
func (s *Server) resumeHeld() {
	for _, pid := range s.held {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
	s.held = nil
}

// resumeHeldAfterQuit continues the held processes once the postmaster, ending every
// child after a backend's crash, has sent each its SIGQUIT (or SIGABRT): continued
// earlier, one could still write WAL; not continued, none would ever exit.
func (s *Server) resumeHeldAfterQuit(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	const quit = 1<<(syscall.SIGQUIT-1) | 1<<(syscall.SIGABRT-1)
	for _, pid := range s.held {
		for {
			status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil || pendingSignals(status)&quit != 0 {
				break // gone, or told to quit
			}
			select {
			case <-ctx.Done():
				s.resumeHeld()
				return fmt.Errorf("pgtest: waiting for the postmaster to end process %d: %w", pid, ctx.Err())
			case <-time.After(waitEventPoll):
			}
		}
	}
	s.resumeHeld()
	return nil
}

// pendingSignals returns the signals pending for a process, its own and its thread
// group's (the SigPnd and ShdPnd lines of /proc/<pid>/status).
func pendingSignals(status []byte) uint64 {
	var mask uint64
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && (k == "SigPnd" || k == "ShdPnd") {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			mask |= n
		}
	}
	return mask
}

// backendState returns the state of process pid (/proc/<pid>/stat: 'R', 'S', 'T', …),
// and fails unless it is a live child of the server's postmaster: an error wrapping
// os.ErrNotExist when it is gone or a zombie.
func (s *Server) backendState(pid uint32) (byte, error) {
	pm, err := os.ReadFile(filepath.Join(s.dataDir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("pgtest: reading the postmaster's PID: %w", err)
	}
	postmaster, _, _ := strings.Cut(string(pm), "\n")
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, fmt.Errorf("pgtest: process %d: %w", pid, err)
	}
	// The state and the parent follow the command, in parentheses.
	fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
	switch {
	case len(fields) < 2 || fields[1] != strings.TrimSpace(postmaster):
		return 0, fmt.Errorf("pgtest: process %d is not a backend of the server (postmaster %s)", pid, strings.TrimSpace(postmaster))
	case fields[0] == "Z" || fields[0] == "X":
		return 0, fmt.Errorf("pgtest: backend %d has exited: %w", pid, os.ErrNotExist)
	}
	return fields[0][0], nil
}

// checkpointerPID returns the PID of the server's checkpointer.
func (s *Server) checkpointerPID(ctx context.Context) (pid int64, err error) {
	err = s.withConn(ctx, func(c *pgx.Conn) error {
		return c.QueryRow(ctx, "SELECT pid FROM pg_stat_activity WHERE backend_type = 'checkpointer'").Scan(&pid)
	})
	return pid, err
}

// Cancel cancels the backend's current query with pg_cancel_backend. It
// returns an error if PostgreSQL reports false (no such backend).
func (s *Server) Cancel(ctx context.Context, pid uint32) error {
	return s.signalBackend(ctx, "pg_cancel_backend", pid)
}

// signalBackend calls the server function fn (pg_cancel_backend, pg_terminate_backend)
// on pid over an admin connection, and fails if the backend was not there to signal.
func (s *Server) signalBackend(ctx context.Context, fn string, pid uint32) error {
	return s.withConn(ctx, func(c *pgx.Conn) error { return signalOn(ctx, c, fn, pid) })
}

// signalOn is signalBackend on the connection c, for a helper that already has one open.
func signalOn(ctx context.Context, c *pgx.Conn, fn string, pid uint32) error {
	var ok bool
	if err := c.QueryRow(ctx, "SELECT "+fn+"($1)", int64(pid)).Scan(&ok); err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("pgtest: %s(%d) returned false", fn, pid)
	}
	return nil
}

// TerminateInSyncRep waits until the backend pid waits for a synchronous standby
// (wait_event SyncRep: its COMMIT's record is in the local WAL, the commit not yet
// acknowledged) and terminates it there: the commit stands on the server, and its client
// never hears of it — a real indeterminate commit. It waits and terminates on one admin
// connection, which it opens.
func (s *Server) TerminateInSyncRep(ctx context.Context, pid uint32) error {
	return s.withConn(ctx, func(c *pgx.Conn) error { return terminateInSyncRep(ctx, c, waitEventPoll, pid) })
}

// TerminateInSyncRepOn is TerminateInSyncRep on the connection c, which the caller opened
// beforehand, and it polls without a pause. It is for a program that shows how long the
// commit waited (scripts/tracepicture draws it): neither opening a connection nor the
// pause between two polls then stretches that wait. Tests use TerminateInSyncRep.
func TerminateInSyncRepOn(ctx context.Context, c *pgx.Conn, pid uint32) error {
	return terminateInSyncRep(ctx, c, 0, pid)
}

// terminateInSyncRep is TerminateInSyncRep on the connection c, polling every pause (0: as
// soon as each answer comes), so that both ways of calling it wait and terminate alike.
func terminateInSyncRep(ctx context.Context, c *pgx.Conn, pause time.Duration, pid uint32) error {
	if err := waitForWaitEvent(ctx, c, pause, pid, "SyncRep"); err != nil {
		return err
	}
	return signalOn(ctx, c, "pg_terminate_backend", pid)
}

// WaitForWaitEvent polls pg_stat_activity until the backend's wait_event
// equals event (e.g. "SyncRep", "PgSleep"). It fails when ctx ends or when
// the backend is no longer listed, since then the event can never appear.
func (s *Server) WaitForWaitEvent(ctx context.Context, pid uint32, event string) error {
	return s.withConn(ctx, func(c *pgx.Conn) error { return waitForWaitEvent(ctx, c, waitEventPoll, pid, event) })
}

// waitForWaitEvent is WaitForWaitEvent on the connection c, polling every pause (see
// pollOn), for the helpers that go on to signal the backend on the same connection.
func waitForWaitEvent(ctx context.Context, c *pgx.Conn, pause time.Duration, pid uint32, event string) error {
	last := "NULL"
	err := pollOn(ctx, c, pause, fmt.Sprintf("backend %d to reach wait_event %q", pid, event), func(c *pgx.Conn) (bool, error) {
		// Each autocommit statement sees a fresh statistics snapshot.
		var we *string
		err := c.QueryRow(ctx, "SELECT wait_event FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&we)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, fmt.Errorf("pgtest: backend %d is not in pg_stat_activity (exited?)", pid)
		}
		if err != nil {
			return false, err
		}
		if we != nil {
			last = *we
		}
		return we != nil && *we == event, nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (last seen %s)", err, last)
	}
	return err
}

// XactStatus reports pg_xact_status for a full transaction id (as returned
// by pg_current_xact_id()): "committed", "aborted" or "in progress". ok is
// false when PostgreSQL returns NULL (the xid is too old to know).
func (s *Server) XactStatus(ctx context.Context, xid uint64) (status string, ok bool, err error) {
	err = s.withConn(ctx, func(c *pgx.Conn) error {
		var st *string
		if err := c.QueryRow(ctx, "SELECT pg_xact_status($1::xid8)", xid).Scan(&st); err != nil {
			return err
		}
		if st != nil {
			status, ok = *st, true
		}
		return nil
	})
	return status, ok, err
}

// Exec runs one statement on a fresh admin connection, for test setup.
func (s *Server) Exec(ctx context.Context, sql string, args ...any) error {
	return s.withConn(ctx, func(c *pgx.Conn) error {
		_, err := c.Exec(ctx, sql, args...)
		return err
	})
}

// poll runs check on one admin connection every waitEventPoll until it reports done,
// fails, or ctx ends. Tests wait on observable server state this way, never on sleeps.
func (s *Server) poll(ctx context.Context, what string, check func(*pgx.Conn) (bool, error)) error {
	return s.withConn(ctx, func(c *pgx.Conn) error { return pollOn(ctx, c, waitEventPoll, what, check) })
}

// pollOn is poll on the connection c, every pause; with a pause of 0 it runs check again
// as soon as it answers, for a caller to whom the wait's length matters more than the
// server's load (TerminateInSyncRepOn).
func pollOn(ctx context.Context, c *pgx.Conn, pause time.Duration, what string, check func(*pgx.Conn) (bool, error)) error {
	var tick <-chan time.Time
	if pause > 0 {
		t := time.NewTicker(pause)
		defer t.Stop()
		tick = t.C
	}
	for {
		done, err := check(c)
		if err != nil || done {
			return err
		}
		if tick == nil {
			if ctx.Err() != nil {
				return fmt.Errorf("pgtest: waiting for %s: %w", what, ctx.Err())
			}
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgtest: waiting for %s: %w", what, ctx.Err())
		case <-tick:
		}
	}
}

// Count runs query, a count(*), on a fresh admin connection and returns its answer.
func (s *Server) Count(ctx context.Context, query string, args ...any) (n int, err error) {
	err = s.withConn(ctx, func(c *pgx.Conn) error { return c.QueryRow(ctx, query, args...).Scan(&n) })
	return n, err
}

// WaitForCount polls query, a count(*), until it answers want. It fails with what and the
// last count when ctx ends: a test waits this way for the server to reach a state (a
// backend gone, a lock waited on) rather than sleeping.
func (s *Server) WaitForCount(ctx context.Context, want int, what, query string, args ...any) error {
	last := -1
	err := s.poll(ctx, what, func(c *pgx.Conn) (bool, error) {
		if err := c.QueryRow(ctx, query, args...).Scan(&last); err != nil {
			return false, err
		}
		return last == want, nil
	})
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (count %d, want %d)", err, last, want)
	}
	return err
}

// WaitXactSettled polls pg_xact_status until the transaction is no longer "in
// progress" and returns "committed" or "aborted". A backend that lost its client
// (terminated, cut by a proxy) finishes its transaction asynchronously.
func (s *Server) WaitXactSettled(ctx context.Context, xid uint64) (string, error) {
	var status string
	err := s.poll(ctx, fmt.Sprintf("xid %d to settle", xid), func(c *pgx.Conn) (bool, error) {
		var st *string
		if err := c.QueryRow(ctx, "SELECT pg_xact_status($1::xid8)", xid).Scan(&st); err != nil {
			return false, err
		}
		if st == nil {
			return false, fmt.Errorf("pgtest: pg_xact_status(%d) is NULL", xid)
		}
		status = *st
		return status != "in progress", nil
	})
	return status, err
}

// WaitBackendGone polls until the backend with pid has left pg_stat_activity.
func (s *Server) WaitBackendGone(ctx context.Context, pid uint32) error {
	return s.poll(ctx, fmt.Sprintf("backend %d to exit", pid), func(c *pgx.Conn) (bool, error) {
		var n int
		err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&n)
		return n == 0, err
	})
}

// WaitQuiet polls until no other client backend is running a statement or sits in a
// transaction: then every commit a lost client left behind has finished.
func (s *Server) WaitQuiet(ctx context.Context) error {
	return s.poll(ctx, "the server to be quiet", func(c *pgx.Conn) (bool, error) {
		var n int
		err := c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND state <> 'idle' AND pid <> pg_backend_pid()").Scan(&n)
		return n == 0, err
	})
}
