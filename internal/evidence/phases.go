package evidence

import "github.com/txevidence/otelpgxtx/outcome"

// Phases is a set of phases: those an event moved a frame to, each once at most, in the
// order of outcome.Phase, which is the only order a frame can move in.
type Phases uint8

// With returns p with phase added.
func (p Phases) With(phase outcome.Phase) Phases { return p | 1<<phase }

// Has reports whether p holds phase.
func (p Phases) Has(phase outcome.Phase) bool { return p&(1<<phase) != 0 }

// Each calls fn with each phase of p, in order.
func (p Phases) Each(fn func(outcome.Phase)) {
	for phase := outcome.PhaseNotStarted; phase <= outcome.PhaseUnknown; phase++ {
		if p.Has(phase) {
			fn(phase)
		}
	}
}
