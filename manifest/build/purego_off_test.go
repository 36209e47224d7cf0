//go:build !purego

package build

// purego: see purego_on_test.go.
const purego = false
