//go:build !purego

package manifest

// purego: see purego_on_test.go.
const purego = false
