package cli

import (
	"encoding/json"
	"io"
	"text/tabwriter"
)

// printOut prints v as JSON with -o json, or calls table with a tab
// writer otherwise. It is the one printer of every command.
func printOut(f *Factory, v any, table func(w io.Writer)) error {
	if f.Global.Output == "json" {
		enc := json.NewEncoder(f.Out)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	tw := tabwriter.NewWriter(f.Out, 0, 4, 2, ' ', 0)
	table(tw)
	return tw.Flush()
}
