//go:build !(linux || darwin)

package build

// freeBytes cannot tell the free space here.
func freeBytes(dir string) (int64, bool) { return 0, false }
