package manifest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sort"
	"strings"

	"github.com/ttquant/ttquant/internal/atomicfile"
)

// PartialSuffix marks a file being written; such a file is never part of a
// finished checkpoint.
const PartialSuffix = atomicfile.Suffix

// SHA256Hex returns the hex sha256 of b.
func SHA256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// EncodeSums renders a SHA256SUMS file (the text format of `sha256sum`:
// hash, two spaces, name) for the given entries, sorted by name. Names use
// forward slashes relative to the checkpoint directory.
func EncodeSums(files []FileEntry) []byte {
	fs := append([]FileEntry(nil), files...)
	sort.Slice(fs, func(i, j int) bool { return fs[i].Name < fs[j].Name })
	var b bytes.Buffer
	for _, f := range fs {
		fmt.Fprintf(&b, "%s  %s\n", f.SHA256, f.Name)
	}
	return b.Bytes()
}

// validRelName reports whether name is a clean relative path inside a
// checkpoint directory (no "..", no absolute path, forward slashes, no
// characters that sha256sum would escape).
func validRelName(name string) bool {
	if name == "" || strings.HasPrefix(name, "/") || strings.ContainsAny(name, "\\\n\r\x00") {
		return false
	}
	for _, part := range strings.Split(name, "/") {
		if part == "" || part == "." || part == ".." {
			return false
		}
	}
	return true
}
