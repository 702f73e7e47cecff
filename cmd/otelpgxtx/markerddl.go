package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/txevidence/otelpgxtx/internal/markertable"
	"github.com/txevidence/otelpgxtx/reconcile"
)

const markerDDLUsage = `usage: otelpgxtx marker-ddl table

Prints the SQL that creates the commit-marker table ("schema"."name", or schema.name for
lower-case names), for psql.
`

// markerDDLCmd prints reconcile.MarkerTableDDL's statement for the table an operator
// names, so that the runbook's table is the library's, never a copy of its SQL that drifts.
func markerDDLCmd(args []string, stdout, stderr io.Writer) int {
	fs := newFlags("marker-ddl", markerDDLUsage)
	if code, ok := parseFlags(fs, args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintf(stderr, "otelpgxtx marker-ddl: %d arguments, want one table\n\n", fs.NArg())
		fs.SetOutput(stderr)
		fs.Usage()
		return exitBad
	}
	parts, err := markertable.Parse(fs.Arg(0))
	if err == nil {
		var ddl string
		if ddl, err = reconcile.MarkerTableDDL(parts); err == nil {
			fmt.Fprintln(stdout, strings.TrimRight(ddl, "; \n")+";")
			return exitSettled
		}
	}
	fmt.Fprintln(stderr, "otelpgxtx marker-ddl:", err)
	return exitBad
}
