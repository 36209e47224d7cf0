package fslock

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The test binary doubles as a helper process: with FSLOCK_HELPER set it
// locks FSLOCK_DIR and behaves as the mode says instead of running tests.
func TestMain(m *testing.M) {
	if mode := os.Getenv("FSLOCK_HELPER"); mode != "" {
		os.Exit(helper(mode, os.Getenv("FSLOCK_DIR")))
	}
	os.Exit(m.Run())
}

// helper modes:
//
//	race: wait until FSLOCK_START (unix nanoseconds), try the lock; the
//	winner marks itself inside with an O_EXCL file (exit 3 if another
//	writer is inside), holds the lock 100 ms and exits 0; a loser prints
//	the error and exits 1.
//	die: take the lock and exit without releasing it.
//	hold: take the lock, print "locked", hold it until stdin closes.
func helper(mode, dir string) int {
	switch mode {
	case "race":
		start, _ := strconv.ParseInt(os.Getenv("FSLOCK_START"), 10, 64)
		time.Sleep(time.Until(time.Unix(0, start)))
		t0 := time.Now()
		l, err := Acquire(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			fmt.Fprintf(os.Stderr, "elapsed %d\n", time.Since(t0))
			return 1
		}
		inside := filepath.Join(filepath.Dir(dir), filepath.Base(dir)+".inside")
		f, err := os.OpenFile(inside, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "TWO WRITERS:", err)
			return 3
		}
		f.Close()
		fmt.Println(os.Getpid())
		time.Sleep(100 * time.Millisecond)
		os.Remove(inside)
		l.Release()
		return 0
	case "die":
		if _, err := Acquire(dir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "hold":
		l, err := Acquire(dir)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println("locked")
		var b [1]byte
		os.Stdin.Read(b[:])
		l.Release()
		return 0
	}
	return 2
}

func helperCmd(t *testing.T, mode, dir string, env ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(exe, "-test.run=^$")
	c.Env = append(os.Environ(), append([]string{"FSLOCK_HELPER=" + mode, "FSLOCK_DIR=" + dir}, env...)...)
	return c
}

// TestConcurrentRunsOneWriter runs 50 trials of two processes starting at
// the same instant on one directory: never are both inside, and the loser
// exits non-zero within a second with an error naming the winner's pid.
func TestConcurrentRunsOneWriter(t *testing.T) {
	const trials = 50
	root := t.TempDir()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 10)
	errs := make([]error, trials)
	for trial := 0; trial < trials; trial++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			errs[trial] = raceTrial(t, filepath.Join(root, fmt.Sprint(trial), "out"))
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("trial %d: %v", i, err)
		}
	}
}

func raceTrial(t *testing.T, dir string) error {
	start := strconv.FormatInt(time.Now().Add(300*time.Millisecond).UnixNano(), 10)
	type result struct {
		code           int
		stdout, stderr string
	}
	var res [2]result
	var wg sync.WaitGroup
	for i := range res {
		c := helperCmd(t, "race", dir, "FSLOCK_START="+start)
		var o, e bytes.Buffer
		c.Stdout, c.Stderr = &o, &e
		if err := c.Start(); err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := c.Wait()
			res[i] = result{code: c.ProcessState.ExitCode(), stdout: o.String(), stderr: e.String()}
			_ = err
		}()
	}
	wg.Wait()
	winners := 0
	for _, r := range res {
		switch r.code {
		case 3:
			return fmt.Errorf("two writers at once: %s", r.stderr)
		case 0:
			winners++
		}
	}
	if winners == 0 {
		return fmt.Errorf("no process got the lock: %+v", res)
	}
	for i, r := range res {
		if r.code == 0 {
			continue
		}
		win := strings.TrimSpace(res[1-i].stdout)
		if r.code != 1 || !strings.Contains(r.stderr, "pid "+win+" (") || !strings.Contains(r.stderr, "is being written by") {
			return fmt.Errorf("loser: exit %d, stderr %q; want exit 1 naming pid %s", r.code, r.stderr, win)
		}
		// From its attempt to its exit (process start-up under load is
		// not the lock's doing).
		var ns int64
		if i := strings.Index(r.stderr, "elapsed "); i >= 0 {
			fmt.Sscanf(r.stderr[i:], "elapsed %d", &ns)
		}
		if d := time.Duration(ns); d <= 0 || d > time.Second {
			return fmt.Errorf("loser took %v from its attempt to its exit", d)
		}
	}
	return nil
}

// TestGoroutinesOneWriter races goroutines, each with its own open file
// description, 50 times: at most one holds the lock at any moment and the
// others fail at once naming this process.
func TestGoroutinesOneWriter(t *testing.T) {
	root := t.TempDir()
	for trial := 0; trial < 50; trial++ {
		dir := filepath.Join(root, fmt.Sprint(trial))
		var inside, maxInside, wins atomic.Int32
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				t0 := time.Now()
				l, err := Acquire(dir)
				if err != nil {
					var he *HeldError
					if !errors.As(err, &he) || !errors.Is(err, ErrHeld) || he.PID != os.Getpid() || he.Command == "" {
						t.Errorf("trial %d: error %v, want a HeldError naming pid %d", trial, err, os.Getpid())
					}
					if d := time.Since(t0); d > time.Second {
						t.Errorf("trial %d: refusal took %v", trial, d)
					}
					return
				}
				wins.Add(1)
				n := inside.Add(1)
				for {
					m := maxInside.Load()
					if n <= m || maxInside.CompareAndSwap(m, n) {
						break
					}
				}
				time.Sleep(2 * time.Millisecond)
				inside.Add(-1)
				if err := l.Release(); err != nil {
					t.Errorf("release: %v", err)
				}
			}()
		}
		close(gate)
		wg.Wait()
		if maxInside.Load() != 1 || wins.Load() < 1 {
			t.Fatalf("trial %d: %d writers at once, %d wins", trial, maxInside.Load(), wins.Load())
		}
	}
}

// TestHolderNamedAndReleasedOnExit: a process holding the lock is named in
// the error; once it exits the lock is free again, even without Release.
func TestHolderNamedAndReleasedOnExit(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "out")
	c := helperCmd(t, "hold", dir)
	stdin, _ := c.StdinPipe()
	stdout, _ := c.StdoutPipe()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.Contains(line, "locked") {
		t.Fatalf("helper did not lock: %q, %v", line, err)
	}
	t0 := time.Now()
	_, err = Acquire(dir)
	var he *HeldError
	if !errors.As(err, &he) || he.PID != c.Process.Pid || !strings.Contains(err.Error(), fmt.Sprintf("pid %d (", c.Process.Pid)) {
		t.Fatalf("Acquire while held: %v, want the holder pid %d", err, c.Process.Pid)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("refusal took %v", d)
	}
	c.Process.Kill() // dies holding the lock: the kernel releases it
	c.Wait()
	stdin.Close()
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after the holder died: %v", err)
	}
	if l.Stale != c.Process.Pid {
		t.Errorf("Stale = %d, want the dead holder's pid %d", l.Stale, c.Process.Pid)
	}
	l.Release()
}

// TestStaleLockFile: a lock file left by a process that exited without
// releasing is taken over.
func TestStaleLockFile(t *testing.T) {
	dir := t.TempDir()
	c := helperCmd(t, "die", dir)
	if out, err := c.CombinedOutput(); err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, Name)); err != nil {
		t.Fatalf("the helper left no lock file: %v", err)
	}
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("stale lock not taken over: %v", err)
	}
	if l.Stale != c.Process.Pid {
		t.Errorf("Stale = %d, want %d", l.Stale, c.Process.Pid)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestReleaseLeavesDirectoryAsFound: the lock file goes away, and so do the
// directories Acquire had to create; an existing directory stays.
func TestReleaseLeavesDirectoryAsFound(t *testing.T) {
	root := t.TempDir()
	deep := filepath.Join(root, "a", "b", "c")
	l, err := Acquire(deep)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(deep, Name)); err != nil {
		t.Fatalf("no lock file while held: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("created directories left behind: %v", err)
	}
	l, err = Acquire(root)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	l.Release()
	ents, err := os.ReadDir(root)
	if err != nil || len(ents) != 0 {
		t.Errorf("existing directory after release: %v entries, err %v", len(ents), err)
	}
}

// TestAcquireExisting: a directory to finish is locked; a missing path or
// a file is refused and nothing is created.
func TestAcquireExisting(t *testing.T) {
	d := t.TempDir()
	l, err := AcquireExisting(d)
	if err != nil {
		t.Fatal(err)
	}
	l.Release()
	missing := filepath.Join(d, "missing")
	if _, err := AcquireExisting(missing); err == nil {
		t.Error("a missing directory was locked")
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("AcquireExisting created the missing directory")
	}
	f := filepath.Join(d, "file")
	os.WriteFile(f, nil, 0o644)
	if _, err := AcquireExisting(f); err == nil {
		t.Error("a file was locked as a directory")
	}
}
