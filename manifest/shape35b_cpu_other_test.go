//go:build !unix

package manifest

func shape35BCPU() float64 { return 0 }
