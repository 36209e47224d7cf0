//go:build !(linux || darwin)

package testmodel

import "testing"

// diskUsage is unknown on this platform.
func diskUsage(t *testing.T, dir string) int64 { return -1 }
