package pgtest

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// userHZ is the unit of utime and stime in /proc/<pid>/stat (USER_HZ, 100 on Linux).
const userHZ = 100

// BackendCPU returns the CPU time a server backend (a single-threaded process, such
// as the one pgconn.PgConn.PID names) has used so far. It reads
// /proc/<pid>/schedstat, exact to the nanosecond, or /proc/<pid>/stat's utime+stime
// (10 ms ticks) on a kernel without schedstat. The server runs as its own OS user,
// so the caller needs that user's rights or root's.
func BackendCPU(pid uint32) (time.Duration, error) {
	if d, err := schedstatCPU(pid); err == nil {
		return d, nil
	}
	return statCPU(pid)
}

// schedstatCPU reads pid's CPU time in nanoseconds from /proc/<pid>/schedstat.
func schedstatCPU(pid uint32) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("pgtest: /proc/%d/schedstat is empty", pid)
	}
	ns, err := strconv.ParseInt(f[0], 10, 64)
	return time.Duration(ns), err
}

// statCPU reads pid's CPU time from /proc/<pid>/stat, which counts it in clock ticks, for kernels
// without schedstat.
func statCPU(pid uint32) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name, field 2, is in parentheses and may contain spaces: count from
	// the last ')'. utime and stime are fields 14 and 15 of the line.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("pgtest: /proc/%d/stat: unexpected format", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3
	if len(f) < 13 {
		return 0, fmt.Errorf("pgtest: /proc/%d/stat: unexpected format", pid)
	}
	var ticks int64
	for _, v := range f[11:13] {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("pgtest: /proc/%d/stat: %w", pid, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
