package main

import (
	"encoding/json"
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
