//go:build !unix

package forward

func cpuSeconds() float64 { return 0 }
