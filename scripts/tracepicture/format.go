package main

import (
	"fmt"
	"strings"
	"time"
)

// shortRef shortens a reconciliation reference for the picture: each long number of
// it (the system identifier, the times) keeps its first and last four digits; what follows
// the first ";" (";flushed=…", ";pooled", a marker) stays as it is.
func shortRef(ref string) string {
	ref, suffix, hasSuffix := strings.Cut(ref, ";")
	if hasSuffix {
		suffix = ";" + suffix
	}
	prefix, rest, ok := strings.Cut(ref, ":")
	if !ok {
		prefix, rest = "", ref
	} else {
		prefix += ":"
	}
	parts := strings.Split(rest, "/")
	for i, part := range parts {
		if len(part) > 10 {
			parts[i] = part[:4] + "…" + part[len(part)-4:]
		}
	}
	return prefix + strings.Join(parts, "/") + suffix
}

// formatDuration writes d as Jaeger does: in the largest unit under which it is at least
// one, with at most two decimals.
func formatDuration(d time.Duration) string {
	trim := func(v float64, unit string) string {
		s := strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
		return s + unit
	}
	switch {
	case d == 0:
		return "0µs"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return trim(float64(d)/float64(time.Microsecond), "µs")
	case d < time.Second:
		return trim(float64(d)/float64(time.Millisecond), "ms")
	}
	return trim(d.Seconds(), "s")
}
