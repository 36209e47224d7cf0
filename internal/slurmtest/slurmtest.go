//go:build linux

// Package slurmtest starts a real single-node Slurm cluster on the machine
// running the tests — munged, slurmctld and slurmd from the distribution's
// packages, with a private configuration, state, spool and munge socket in a
// temporary directory — so that tests submit job arrays to the scheduler the
// users run (docs/distributed.md). .ci/run installs the packages; where the
// programs are missing or the tests do not run as root, Start skips the test
// and says why. Everything it starts is stopped when the test ends.
//
// Imported by tests only; it imports nothing of the module.
package slurmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Programs the cluster needs, looked up on PATH and in /usr/sbin.
var programs = []string{"munged", "slurmctld", "slurmd", "sbatch", "sinfo", "scancel"}

// Cluster is a running single-node cluster: one partition "debug" on one
// node "localhost" with CPUs CPUs.
type Cluster struct {
	Dir  string // the private directory: slurm.conf, state, spool, logs, the munge socket
	Conf string // the slurm.conf path, passed to every client as SLURM_CONF

	bin map[string]string
}

// Start starts the cluster, waits until its node is idle and registers its
// shutdown with tb.Cleanup. It skips the test when the Slurm or munge
// programs are missing or the process is not root (the daemons run as
// root and munged as the munge user); a daemon that does not come up is a
// failure, with its log.
//
// It is long by design: the start-up script of the cluster, step after
// step, each with its own failure message.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	if os.Getuid() != 0 {
		tb.Skip("slurmtest: the Slurm daemons need root; run as root (CI does)")
	}
	c := &Cluster{bin: map[string]string{}}
	for _, p := range programs {
		path, err := exec.LookPath(p)
		if err != nil {
			if _, serr := os.Stat(filepath.Join("/usr/sbin", p)); serr == nil {
				path, err = filepath.Join("/usr/sbin", p), nil
			}
		}
		if err != nil {
			tb.Skipf("slurmtest: %s is not installed (Debian packages slurmctld, slurmd, slurm-client, munge; .ci/run installs them)", p)
		}
		c.bin[p] = path
	}
	munge, err := user.Lookup("munge")
	if err != nil {
		tb.Skipf("slurmtest: no munge user: %v", err)
	}
	key := "/etc/munge/munge.key"
	if _, err := os.Stat(key); err != nil {
		tb.Skipf("slurmtest: no munge key (%v); the munge package creates it", err)
	}
	dir, err := os.MkdirTemp("", "ttquant-slurm-")
	if err != nil {
		tb.Fatal(err)
	}
	// munged checks that every directory above its socket is searchable.
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	c.Dir = dir
	tb.Cleanup(func() { os.RemoveAll(dir) })
	for _, d := range []string{"state", "spool", "log", "munge"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			tb.Fatal(err)
		}
	}
	uid, _ := strconv.Atoi(munge.Uid)
	gid, _ := strconv.Atoi(munge.Gid)
	mdir := filepath.Join(dir, "munge")
	if err := os.Chown(mdir, uid, gid); err != nil {
		tb.Fatal(err)
	}
	if err := os.Chmod(mdir, 0o711); err != nil {
		tb.Fatal(err)
	}
	sock := filepath.Join(mdir, "socket")
	md := exec.Command(c.bin["munged"], "--socket="+sock, "--pid-file="+filepath.Join(mdir, "pid"),
		"--log-file="+filepath.Join(mdir, "log"), "--seed-file="+filepath.Join(mdir, "seed"), "--key-file="+key)
	md.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	if out, err := md.CombinedOutput(); err != nil {
		tb.Fatalf("slurmtest: munged: %v\n%s%s", err, out, readLog(filepath.Join(mdir, "log")))
	}
	tb.Cleanup(func() { stopPidFile(filepath.Join(mdir, "pid")) })

	ports, err := freePorts(2)
	if err != nil {
		tb.Fatal(err)
	}
	c.Conf = filepath.Join(dir, "slurm.conf")
	conf := fmt.Sprintf(`ClusterName=ttquant
SlurmctldHost=localhost
SlurmctldPort=%d
SlurmdPort=%d
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%s
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation=%s
SlurmdSpoolDir=%s
SlurmctldPidFile=%s
SlurmdPidFile=%s
SlurmctldLogFile=%s
SlurmdLogFile=%s
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
NodeName=localhost CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
`, ports[0], ports[1], sock,
		filepath.Join(dir, "state"), filepath.Join(dir, "spool"),
		filepath.Join(dir, "slurmctld.pid"), filepath.Join(dir, "slurmd.pid"),
		filepath.Join(dir, "log", "slurmctld.log"), filepath.Join(dir, "log", "slurmd.log"))
	if err := os.WriteFile(c.Conf, []byte(conf), 0o644); err != nil {
		tb.Fatal(err)
	}
	// Daemons fork into the background; their pid files stop them.
	for _, d := range []struct{ prog, pid string }{{"slurmctld", "slurmctld.pid"}, {"slurmd", "slurmd.pid"}} {
		cmd := exec.Command(c.bin[d.prog], "-f", c.Conf)
		cmd.Env = c.Env()
		if out, err := cmd.CombinedOutput(); err != nil {
			tb.Fatalf("slurmtest: %s: %v\n%s%s", d.prog, err, out, c.Logs())
		}
		pid := filepath.Join(dir, d.pid)
		tb.Cleanup(func() { stopPidFile(pid) })
	}
	tb.Cleanup(func() {
		cmd := exec.Command(c.bin["scancel"], "--full", "--user=root")
		cmd.Env = c.Env()
		cmd.Run()
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		cmd := exec.Command(c.bin["sinfo"], "--noheader", "--format=%t")
		cmd.Env = c.Env()
		out, _ := cmd.Output()
		if state := strings.TrimSpace(string(out)); state == "idle" {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("slurmtest: the node did not become idle in 60 s (sinfo: %q)\n%s", out, c.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}
	return c
}

// Env returns the environment for Slurm's clients: this process's, with
// SLURM_CONF naming the cluster's configuration and any SLURM_* variable of
// an enclosing job removed.
func (c *Cluster) Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLURM_") {
			env = append(env, kv)
		}
	}
	return append(env, "SLURM_CONF="+c.Conf)
}

// Sbatch runs sbatch with args and --parsable and returns the job id. With
// --wait among args it returns when the job has ended; a job that fails makes
// sbatch, and so Sbatch, fail.
func (c *Cluster) Sbatch(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.bin["sbatch"], append([]string{"--parsable"}, args...)...)
	cmd.Env = c.Env()
	cmd.Dir = c.Dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("sbatch %s: %w\n%s%s", strings.Join(args, " "), err, stderr.Bytes(), c.Logs())
	}
	id, _, _ := strings.Cut(strings.TrimSpace(stdout.String()), ";")
	return id, nil
}

// Logs returns the daemons' logs, for failure messages.
func (c *Cluster) Logs() string {
	var b strings.Builder
	for _, f := range []string{"log/slurmctld.log", "log/slurmd.log", "munge/log"} {
		fmt.Fprintf(&b, "--- %s\n%s", f, readLog(filepath.Join(c.Dir, f)))
	}
	return b.String()
}

func readLog(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error() + "\n"
	}
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// stopPidFile sends SIGTERM to the process in a pid file and waits up to
// ten seconds for it to go.
func stopPidFile(path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil || pid <= 1 {
		return
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return
	}
	if p.Signal(syscall.SIGTERM) != nil {
		return
	}
	for range 100 {
		if err := p.Signal(syscall.Signal(0)); errors.Is(err, os.ErrProcessDone) || errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	p.Signal(syscall.SIGKILL)
}

// freePorts returns n TCP ports on the loopback address that were free a
// moment ago.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
