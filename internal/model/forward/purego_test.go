//go:build purego

package forward

const pureGo = true
