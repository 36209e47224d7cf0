package importcheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/internal/testdata"
)

// maxFuncLines is the length above which a function must say why it is
// long: a sentence "It is long by design: …" in its doc comment.
const maxFuncLines = 100

// toSplit are the long functions that do not say so yet and are to be
// split: a debt, listed so that it only shrinks. A function that is split
// must leave the list (the test says so), and a new long function must
// either give its reason or be split.
var toSplit = map[string]bool{}

// TestLongFunctionsSayWhy: every non-test function over maxFuncLines lines
// gives its reason in its doc comment, or is one of toSplit.
func TestLongFunctionsSayWhy(t *testing.T) {
	root := testdata.RepoRoot()
	fset := token.NewFileSet()
	seen := map[string]bool{}
	var bad []string
	for _, rel := range moduleGoFiles(t, root) {
		if strings.HasSuffix(rel, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(root, rel), nil, parser.ParseComments)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			n := fset.Position(fd.End()).Line - fset.Position(fd.Pos()).Line + 1
			if n <= maxFuncLines {
				continue
			}
			key := rel + ":" + fd.Name.Name
			seen[key] = true
			if fd.Doc != nil && strings.Contains(fd.Doc.Text(), "It is long by design: ") {
				continue
			}
			if !toSplit[key] {
				bad = append(bad, key)
			}
		}
	}
	sort.Strings(bad)
	for _, k := range bad {
		t.Errorf("%s is over %d lines: split it, or say why in its doc comment (\"It is long by design: …\")", k, maxFuncLines)
	}
	for k := range toSplit {
		if !seen[k] {
			t.Errorf("%s is no longer over %d lines (or is gone): take it off toSplit", k, maxFuncLines)
		}
	}
}
