//go:build !unix

package safetensors

func processCPUTime() (int64, bool) { return 0, false }
