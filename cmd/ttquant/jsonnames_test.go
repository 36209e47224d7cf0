package main

import (
	"encoding"
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/emulator/eval/harness"
	"github.com/ttquant/ttquant/manifest"
)

// TestJSONNamesSnakeCase: every field of every --json document (and of
// the values they embed, down to the leaves) is named in snake_case by a
// json tag; an untagged field would come out with its Go name.
func TestJSONNamesSnakeCase(t *testing.T) {
	docs := []any{
		benchDoc{}, calibStatsDoc{}, calibQuantizeDoc{}, calibBuildDoc{}, compareDoc{}, buildReport{}, dataDoc{},
		demoReport{}, checkDoc{}, exportResult{}, ttnnVerifyReport{}, dryRunReport{}, inspectDoc{}, tensorbinDoc{},
		planDoc{}, checkpointDoc{}, runDoc{}, testModelDoc{}, tokenizeDoc{}, verifyReport{}, buildInfo{},
		calibDryRunDoc{}, measureShardDoc{}, measureAssembleDoc{},
		// eval --json: the result and what it carries as opaque values.
		eval.Result{}, harness.DataInfo{}, harness.Settings{},
		// the manifest, which --json documents embed pieces of.
		manifest.Manifest{},
	}
	snake := regexp.MustCompile(`^[a-z][a-z0-9]*(_[a-z0-9]+)*$`)
	marshaler := reflect.TypeFor[json.Marshaler]()
	textMarshaler := reflect.TypeFor[encoding.TextMarshaler]()
	seen := map[reflect.Type]bool{}
	var walk func(typ reflect.Type, path string)
	walk = func(typ reflect.Type, path string) {
		for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice || typ.Kind() == reflect.Array || typ.Kind() == reflect.Map {
			typ = typ.Elem()
		}
		if typ.Kind() != reflect.Struct || seen[typ] || typ.Implements(marshaler) || reflect.PointerTo(typ).Implements(marshaler) ||
			typ.Implements(textMarshaler) || reflect.PointerTo(typ).Implements(textMarshaler) || typ.PkgPath() == "time" {
			return
		}
		seen[typ] = true
		for i := range typ.NumField() {
			f := typ.Field(i)
			if !f.IsExported() {
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if name == "-" {
				continue
			}
			if name == "" && f.Anonymous {
				walk(f.Type, path) // promoted fields
				continue
			}
			if !snake.MatchString(name) {
				t.Errorf("%s.%s (%s): JSON name %q is not snake_case", path, f.Name, typ, name)
			}
			walk(f.Type, path+"."+name)
		}
	}
	for _, d := range docs {
		typ := reflect.TypeOf(d)
		walk(typ, typ.String())
	}
}
