//go:build unix

package fslock

import (
	"errors"
	"os"
	"syscall"
)

// tryLock takes an exclusive flock without waiting. supported is false
// when the file system has no flock.
func tryLock(f *os.File) (ok, supported bool, err error) {
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	switch {
	case err == nil:
		return true, true, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		return false, true, nil
	case errors.Is(err, syscall.ENOLCK), errors.Is(err, syscall.EOPNOTSUPP), errors.Is(err, syscall.ENOSYS):
		return false, false, nil
	}
	return false, true, err
}

// pidAlive reports whether a process with this pid exists.
func pidAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
