// Package jsonx holds the two JSON rules ttquant's records share: how a
// record is read (strictly: a field the reader does not know is an error,
// so that a record of another version or a damaged one is refused rather
// than half understood), and how embedded JSON is compared or recorded
// (compacted, so that its bytes do not depend on how it was spelled).
// Records are written by internal/atomicfile (WriteJSON).
//
// The package imports nothing of the module.
package jsonx

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
)

// Unmarshal decodes one JSON value of data into v, refusing a field v
// does not have.
func Unmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	return dec.Decode(v)
}

// ReadFile reads the record at path into v by Unmarshal; a damaged
// record's error names the file.
func ReadFile(path string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// Compact returns data without insignificant white space: nil for no data
// or data that is not JSON.
func Compact(data []byte) json.RawMessage {
	if len(data) == 0 {
		return nil
	}
	var buf bytes.Buffer
	if json.Compact(&buf, data) != nil {
		return nil
	}
	return buf.Bytes()
}

// Same reports whether a and b encode as the same JSON (embedded JSON,
// such as a store's text provenance, compacted); a value that does not
// encode is the same as nothing.
func Same(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}
