//go:build linux || darwin

package build

import "syscall"

// freeBytes is the space an unprivileged user may still write on the file
// system holding dir, false when it cannot be told.
func freeBytes(dir string) (int64, bool) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, false
	}
	return int64(uint64(st.Bavail) * uint64(st.Bsize)), true
}
