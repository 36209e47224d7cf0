//go:build !purego

package harness

const pureGo = false
