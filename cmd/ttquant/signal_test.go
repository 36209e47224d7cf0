//go:build unix

package main

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ttquant/ttquant/internal/atomicfile"
	"github.com/ttquant/ttquant/internal/fslock"
	"github.com/ttquant/ttquant/manifest"
)

// With TTQUANT_TEST_MAIN set to a JSON argument list, the test binary runs
// the command line as main does, signals included.
func TestMain(m *testing.M) {
	if a := os.Getenv("TTQUANT_TEST_MAIN"); a != "" {
		var args []string
		if err := json.Unmarshal([]byte(a), &args); err != nil {
			panic(err)
		}
		if os.Getenv("TTQUANT_TEST_NODURABLE") != "" {
			atomicfile.Durable = false
		}
		if os.Getenv("TTQUANT_TEST_SLOW_WRITES") != "" {
			// Expert files and calibration store parts written slowly,
			// so that a test can stop the process in the middle of one.
			testFaults = func(path string, w io.Writer) io.Writer {
				if strings.Contains(filepath.Base(path), "experts-") || strings.HasSuffix(path, ".part") {
					return slowWriter{w}
				}
				return w
			}
		}
		os.Exit(runWithSignals(args, os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestSIGTERMDuringSourceHashing: SIGTERM while convert hashes a large
// source file stops it within a second, with status 1 and a message that
// says nothing was written, and the output directory is not left behind.
func TestSIGTERMDuringSourceHashing(t *testing.T) {
	src := tinyModel(t)
	// A 16 GiB (sparse) tokenizer file: many seconds of hashing.
	if err := os.WriteFile(filepath.Join(src, "tokenizer_big.json"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filepath.Join(src, "tokenizer_big.json"), 16<<30); err != nil {
		t.Skipf("no sparse files here: %v", err)
	}
	out := filepath.Join(t.TempDir(), "out")
	args, _ := json.Marshal([]string{"convert", "--model", src, "--out", out, "--quiet", "--workers", "1"})
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := exec.Command(exe, "-test.run=^$")
	c.Env = append(os.Environ(), "TTQUANT_TEST_MAIN="+string(args))
	var stderr bytes.Buffer
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	// The lock file appears once the build has started (the signal
	// handler is installed before); hashing the big file follows.
	for i := 0; ; i++ {
		if _, err := os.Stat(filepath.Join(out, fslock.Name)); err == nil {
			break
		}
		if i > 1000 {
			c.Process.Kill()
			t.Fatalf("the build did not start; stderr %q", stderr.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	t0 := time.Now()
	c.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { c.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		c.Process.Kill()
		<-done
		t.Fatalf("convert ignored SIGTERM; stderr %q", stderr.String())
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("convert took %v to stop after SIGTERM", d)
	}
	if code := c.ProcessState.ExitCode(); code != exitError {
		t.Errorf("exit status %d, want %d; stderr %q", code, exitError, stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted: nothing was written") {
		t.Errorf("stderr %q does not say that nothing was written", stderr.String())
	}
	if _, err := os.Stat(out); !os.IsNotExist(err) {
		ents, _ := os.ReadDir(out)
		t.Errorf("the interrupted run left %s behind (%v)", out, ents)
	}
}

// TestInterruptMessageTellsWhatIsKept checks the three states an
// interrupted build can leave.
func TestInterruptMessageTellsWhatIsKept(t *testing.T) {
	root := t.TempDir()
	if s := outDirState(filepath.Join(root, "none")); !strings.Contains(s, "nothing was written") {
		t.Errorf("missing directory: %q", s)
	}
	empty := filepath.Join(root, "empty")
	os.Mkdir(empty, 0o755)
	if s := outDirState(empty); !strings.Contains(s, "nothing was written") {
		t.Errorf("empty directory: %q", s)
	}
	part := filepath.Join(root, "part")
	os.MkdirAll(filepath.Join(part, ".ttquant-partial"), 0o755)
	if s := outDirState(part); !strings.Contains(s, "kept in "+part) || !strings.Contains(s, "resume") {
		t.Errorf("unfinished build: %q", s)
	}
	done := filepath.Join(root, "done")
	os.Mkdir(done, 0o755)
	os.WriteFile(filepath.Join(done, manifest.ManifestName), []byte("{}"), 0o644)
	if s := outDirState(done); !strings.Contains(s, "finished checkpoint, unchanged") {
		t.Errorf("finished checkpoint: %q", s)
	}
}

// slowWriter sleeps before every write.
type slowWriter struct{ w io.Writer }

func (s slowWriter) Write(p []byte) (int, error) {
	time.Sleep(20 * time.Millisecond)
	return s.w.Write(p)
}
