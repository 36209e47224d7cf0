//go:build unix

package build

import (
	"context"
	"errors"
	"github.com/ttquant/ttquant/manifest"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	baselineMu sync.Mutex
	baselines  = map[string]time.Duration{}
)

// verifyBaseline is how long verifying the intact reference checkpoint
// with the same source option takes on this machine under this load (and
// build mode: -race is slow).
func verifyBaseline(t *testing.T, source string) time.Duration {
	baselineMu.Lock()
	defer baselineMu.Unlock()
	if d, ok := baselines[source]; ok {
		return d
	}
	ref := reference(t, "convert")
	t0 := time.Now()
	if _, err := Verify(context.Background(), ref, VerifyOptions{Source: source}); err != nil {
		t.Fatal(err)
	}
	baselines[source] = time.Since(t0)
	return baselines[source]
}

// verifyWithin runs Verify and fails the test if it has not returned within
// limit beyond what verifying the intact checkpoint takes (on a hang the
// goroutine is abandoned): refusing an entry must not cost more than a
// fraction of a second.
func verifyWithin(t *testing.T, limit time.Duration, dir string, opt VerifyOptions) *manifest.VerifyReport {
	t.Helper()
	limit += 4 * verifyBaseline(t, opt.Source)
	type result struct {
		rep *manifest.VerifyReport
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := Verify(context.Background(), dir, opt)
		done <- result{rep, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Verify: %v", r.err)
		}
		return r.rep
	case <-time.After(limit):
		t.Fatalf("Verify did not return within %v", limit)
	}
	return nil
}

// wantFailure checks that the report failed with a failure for file whose
// text contains every one of words.
func wantFailure(t *testing.T, rep *manifest.VerifyReport, file string, words ...string) {
	t.Helper()
	if rep.OK {
		t.Fatalf("Verify accepted the directory")
	}
	for _, f := range rep.Failures {
		if f.File != file {
			continue
		}
		all := true
		for _, w := range words {
			all = all && strings.Contains(f.What, w)
		}
		if all {
			return
		}
	}
	t.Fatalf("no failure for %s mentioning %q; failures: %v", file, words, rep.Failures)
}

func TestVerifyRefusesFIFO(t *testing.T) {
	dir := t.TempDir()
	copyTree(t, reference(t, "convert"), dir)
	// A listed file replaced by a pipe, and an extra pipe.
	for _, name := range []string{"config.json", "extra.fifo"} {
		p := filepath.Join(dir, name)
		os.Remove(p)
		if err := syscall.Mkfifo(p, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	rep := verifyWithin(t, time.Second, dir, VerifyOptions{Source: tinySource(t)})
	wantFailure(t, rep, "config.json", "named pipe", "without opening")
	wantFailure(t, rep, "extra.fifo", "named pipe", "without opening")
	// The manifest itself as a pipe.
	mp := filepath.Join(dir, manifest.ManifestName)
	os.Remove(mp)
	if err := syscall.Mkfifo(mp, 0o644); err != nil {
		t.Fatal(err)
	}
	rep = verifyWithin(t, time.Second, dir, VerifyOptions{})
	wantFailure(t, rep, manifest.ManifestName, "named pipe")
	done := make(chan error, 1)
	go func() { _, err := manifest.OpenCheckpoint(dir); done <- err }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "not a regular file") {
			t.Errorf("manifest.OpenCheckpoint on a pipe manifest: %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("manifest.OpenCheckpoint hangs on a pipe manifest")
	}
}

func TestVerifyRefusesSocket(t *testing.T) {
	dir := t.TempDir()
	copyTree(t, reference(t, "convert"), dir)
	p := filepath.Join(dir, "config.json")
	os.Remove(p)
	l, err := net.Listen("unix", p)
	if err != nil {
		t.Skipf("cannot create a socket here: %v", err)
	}
	defer l.Close()
	rep := verifyWithin(t, time.Second, dir, VerifyOptions{})
	wantFailure(t, rep, "config.json", "socket", "without opening")
}

func TestVerifySymlinks(t *testing.T) {
	ref := reference(t, "convert")
	outside := filepath.Join(t.TempDir(), "config.json")
	b, err := os.ReadFile(filepath.Join(ref, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(outside, b, 0o644)

	dir := t.TempDir()
	copyTree(t, ref, dir)
	p := filepath.Join(dir, "config.json")
	os.Remove(p)
	if err := os.Symlink(outside, p); err != nil {
		t.Fatal(err)
	}
	// Refused by default, and refused with --allow-symlinks since it
	// leaves the checkpoint, although its content is right.
	rep := verifyWithin(t, time.Second, dir, VerifyOptions{})
	wantFailure(t, rep, "config.json", "symbolic link", "refused")
	rep = verifyWithin(t, time.Second, dir, VerifyOptions{AllowSymlinks: true})
	wantFailure(t, rep, "config.json", "outside the checkpoint")

	// A link that stays inside is followed when allowed: the manifest
	// moved to a subdirectory and linked back verifies apart from the
	// extra file.
	dir2 := t.TempDir()
	copyTree(t, ref, dir2)
	os.Mkdir(filepath.Join(dir2, "real"), 0o755)
	if err := os.Rename(filepath.Join(dir2, manifest.ManifestName), filepath.Join(dir2, "real", manifest.ManifestName)); err != nil {
		t.Fatal(err)
	}
	os.Symlink(filepath.Join("real", manifest.ManifestName), filepath.Join(dir2, manifest.ManifestName))
	rep = verifyWithin(t, time.Second, dir2, VerifyOptions{})
	wantFailure(t, rep, manifest.ManifestName, "symbolic link")
	rep = verifyWithin(t, time.Second, dir2, VerifyOptions{AllowSymlinks: true})
	if len(rep.Failures) != 1 || rep.Failures[0].File != "real/"+manifest.ManifestName || rep.Identity == "" {
		t.Errorf("inside link with AllowSymlinks: %v", rep.Failures)
	}
}

func TestVerifyRefusesHugeManifest(t *testing.T) {
	dir := t.TempDir()
	copyTree(t, reference(t, "convert"), dir)
	// 200 MB, sparse: the refusal must come from the size, unread.
	f, err := os.Create(filepath.Join(dir, manifest.ManifestName))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(200 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rep := verifyWithin(t, time.Second, dir, VerifyOptions{})
	wantFailure(t, rep, manifest.ManifestName, "limit", "refused without reading")
	t0 := time.Now()
	if _, err := manifest.OpenCheckpoint(dir); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Errorf("manifest.OpenCheckpoint: %v", err)
	}
	if d := time.Since(t0); d > time.Second {
		t.Errorf("manifest.OpenCheckpoint took %v", d)
	}
}

// TestVerifyAnswersCancel: a listed file replaced by a 16 GiB (sparse)
// one takes many seconds to hash; a cancel must stop Verify within a
// second.
func TestVerifyAnswersCancel(t *testing.T) {
	dir := t.TempDir()
	copyTree(t, reference(t, "convert"), dir)
	big := filepath.Join(dir, "config.json")
	if err := os.Truncate(big, 16<<30); err != nil {
		t.Skipf("no sparse files here: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := Verify(ctx, dir, VerifyOptions{Workers: 2})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	cancel()
	t0 := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Verify after cancel: %v, want context.Canceled", err)
		}
		if d := time.Since(t0); d > time.Second {
			t.Errorf("Verify answered the cancel after %v", d)
		}
	case <-time.After(time.Second):
		t.Fatal("Verify did not answer the cancel within a second")
	}
}

func tinySource(t *testing.T) string {
	src, _ := tinyFixture(t)
	return src
}
