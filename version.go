package otelpgxtx

// ScopeName is the instrumentation scope name of the tracer and meter.
const ScopeName = "github.com/txevidence/otelpgxtx"

// Version is the version of this instrumentation.
func Version() string { return "0.1.0" }
