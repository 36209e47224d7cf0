//go:build purego

package harness

// The pure-Go kernels are many times slower: tests run fewer tokens.
const pureGo = true
