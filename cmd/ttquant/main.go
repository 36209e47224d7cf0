// Command ttquant turns Hugging Face safetensors checkpoints into
// Tenstorrent-native quantized checkpoints and verifies them.
//
// Results go to standard output, logs and progress to standard error.
// Exit status: 0 success, 1 error, 2 usage, 3 verification failed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// Exit statuses.
const (
	exitOK       = 0
	exitError    = 1
	exitUsage    = 2
	exitVerifyKO = 3
)

// command is one subcommand. run receives the arguments after the
// subcommand name and returns an error; errors of type *exitError carry a
// specific status.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, env *env, args []string) error
}

// env is what a subcommand may touch: its output streams and logger.
type env struct {
	stdout io.Writer
	stderr io.Writer
	log    *slog.Logger
}

var commands = map[string]*command{}

func register(c *command) {
	if _, dup := commands[c.name]; dup {
		panic("ttquant: duplicate command " + c.name)
	}
	commands[c.name] = c
}

// statusError makes a subcommand exit with a given status after printing err
// (when err is non-nil).
type statusError struct {
	status int
	err    error
}

func (e *statusError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.status)
	}
	return e.err.Error()
}
func (e *statusError) Unwrap() error { return e.err }

// usageErrorf reports a usage error (exit status 2).
func usageErrorf(format string, args ...any) error {
	return &statusError{status: exitUsage, err: fmt.Errorf(format, args...)}
}

// flagEnvs maps every flag set made by newFlagSet to its command's streams,
// for parseFlags.
var flagEnvs sync.Map // *flag.FlagSet → *env

// newFlagSet returns a flag set for a subcommand: -h and --help print its
// usage on stdout (exit 0), a bad flag is reported with the usage on
// stderr (exit 2).
func newFlagSet(e *env, name, synopsis string) *flag.FlagSet {
	fs := flag.NewFlagSet("ttquant "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: ttquant %s %s\n", name, synopsis)
		fs.PrintDefaults()
	}
	flagEnvs.Store(fs, e)
	return fs
}

// parseFlags parses args: -h/--help print the usage on stdout and end the
// command with status 0; a bad flag is a usage error (status 2) reported
// once, with the usage, on stderr. The flag package stops at the first
// positional argument, so a flag after one would silently become an
// argument: it is a usage error instead, unless "--" ended the flags
// (commands whose flags may follow their arguments use parseInterleaved).
func parseFlags(fs *flag.FlagSet, args []string) error {
	ended, err := parseOnce(fs, args)
	if err != nil || ended || fs.NArg() < 2 {
		return err
	}
	for _, a := range fs.Args()[1:] {
		if len(a) > 1 && a[0] == '-' {
			return usageErrorf("flag %s after the argument %q: give flags before the arguments (or after --, to pass %s as an argument)", a, fs.Arg(0), a)
		}
	}
	return nil
}

// parseOnce parses flags up to the first positional argument, reporting
// whether a "--" ended them.
func parseOnce(fs *flag.FlagSet, args []string) (ended bool, err error) {
	v, _ := flagEnvs.Load(fs)
	e, _ := v.(*env)
	if e == nil {
		e = &env{stdout: io.Discard, stderr: io.Discard}
	}
	fs.SetOutput(io.Discard)
	err = fs.Parse(args)
	switch {
	case err == nil:
		fs.SetOutput(e.stderr)
		used := len(args) - fs.NArg()
		return used > 0 && args[used-1] == "--", nil
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(e.stdout)
		fs.Usage()
		fs.SetOutput(e.stderr)
		return false, &statusError{status: exitOK}
	}
	fs.SetOutput(e.stderr)
	fmt.Fprintln(e.stderr, err)
	fs.Usage()
	return false, &statusError{status: exitUsage}
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: ttquant <command> [flags] [args]\n       ttquant --version")
	fmt.Fprintln(w, "\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nRun 'ttquant <command> -h' for a command's flags.")
}

// run is main without os.Exit, for tests.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	e := &env{stdout: stdout, stderr: stderr, log: slog.New(slog.NewTextHandler(stderr, nil))}
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	name := args[0]
	if name == "-h" || name == "--help" || name == "help" {
		usage(stdout)
		return exitOK
	}
	if name == "--version" || name == "-version" {
		name = "version"
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "ttquant: unknown command %q\n", name)
		usage(stderr)
		return exitUsage
	}
	err := c.run(ctx, e, args[1:])
	if err == nil {
		return exitOK
	}
	status := exitError
	var se *statusError
	if errors.As(err, &se) {
		status = se.status
		if se.err == nil {
			return status
		}
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "ttquant") {
		msg = "ttquant " + name + ": " + msg
	}
	fmt.Fprintln(stderr, msg)
	return status
}

// interruptSignals stop a run cleanly: Ctrl-C, and SIGTERM, which batch
// schedulers and container runtimes send.
var interruptSignals = []os.Signal{os.Interrupt, syscall.SIGTERM}

func main() {
	os.Exit(runWithSignals(os.Args[1:], os.Stdout, os.Stderr))
}

// runWithSignals is run with a context cancelled by the first interrupt
// signal; a second one ends the process at once.
func runWithSignals(args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(context.Background(), interruptSignals...)
	defer stop()
	go func() {
		<-ctx.Done()
		stop()
	}()
	return run(ctx, args, stdout, stderr)
}
