package main

import (
	"encoding/json"
	"fmt"
	"io"
)

// schemaVersion is the version of every --json document this command prints.
// It changes when a field is removed or changes meaning.
const schemaVersion = 1

// writeJSON prints v as an indented JSON document. v should carry a
// SchemaVersion field set from schemaVersion.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// humanBytes formats a byte count in binary units (KiB, MiB, GiB, …): the
// one unit system of every size this command prints.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
