package importcheck

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// TestEveryPackageHasDoc: every package of the module has a package
// comment that go doc shows, one attached to its package clause (a blank
// line between the two detaches it, and go doc then shows none).
func TestEveryPackageHasDoc(t *testing.T) {
	root := testdata.RepoRoot()
	has := map[string]bool{}
	for _, rel := range moduleGoFiles(t, root) {
		if strings.HasSuffix(rel, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(root, rel), nil, parser.PackageClauseOnly|parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.FromSlash(filepath.Dir(rel))
		has[dir] = has[dir] || f.Doc != nil
	}
	var missing []string
	for dir, ok := range has {
		if !ok {
			missing = append(missing, dir)
		}
	}
	sort.Strings(missing)
	for _, dir := range missing {
		t.Errorf("package %s has no package comment attached to its package clause", dir)
	}
}
