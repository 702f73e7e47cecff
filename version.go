package otelpgxtx

import (
	"github.com/txevidence/otelpgxtx/internal/schema"
)

// ScopeName is the instrumentation scope name of the tracer and meter.
const ScopeName = schema.ScopeName

// Version is the version of this instrumentation.
func Version() string { return schema.Version }
