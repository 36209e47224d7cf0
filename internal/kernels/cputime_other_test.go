//go:build !unix

package kernels

import "time"

func processCPU() (time.Duration, bool) { return 0, false }
