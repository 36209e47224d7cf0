//go:build !purego

package forward

const pureGo = false
