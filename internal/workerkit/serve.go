package workerkit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/envconfig"
)

// Environment variables the supervisor sets for a worker (declared in internal/envconfig).
var (
	// EnvParentPID carries the supervisor's pid; the worker exits when its parent is another.
	EnvParentPID = envconfig.ParentPID.Name
	// EnvLogLevel sets the worker's log level (logrus names; default info).
	EnvLogLevel = envconfig.LogLevel.Name
	// EnvTestIgnoreSIGTERM, set to 1, makes the worker ignore SIGTERM. Tests use it to check
	// that the supervisor's kill does not depend on the worker's cooperation.
	EnvTestIgnoreSIGTERM = envconfig.IgnoreSIGTERM.Name
)

// ErrOrphaned is the cause of a worker's exit when its supervisor is gone.
var ErrOrphaned = errors.New("parent process is gone")

// orphanPoll is how often a worker checks that its parent is alive.
const orphanPoll = time.Second

// Kit is what Main hands a worker's constructor.
type Kit struct {
	// Name is the worker's name ("vae", "probe").
	Name string
	// Log is the worker's logger; its lines reach the supervisor's log with the worker's name
	// and pid.
	Log *logrus.Entry
	// Beacon is the page to report ops, steps and bytes on; nil (valid, a no-op) when the
	// worker runs without a supervisor beacon.
	Beacon *beacon.Writer
}

// Main is the whole main function of a worker binary: it builds the worker with newWorker and
// serves it until the supervisor kills it, shuts it down, or goes away; then it exits the
// process. It never returns.
func Main(name string, newWorker func(*Kit) (Worker, error)) {
	ctx, stop := signalContext()
	log := newWorkerLogger()
	err := Serve(ctx, name, log, newWorker)
	stop()
	if err != nil {
		log.WithError(err).Error("worker stopped")
		os.Exit(1)
	}
	os.Exit(0)
}

// signalContext is cancelled by SIGTERM (unless EnvTestIgnoreSIGTERM asks to ignore it).
func signalContext() (context.Context, context.CancelFunc) {
	if envconfig.IgnoreSIGTERM.On() {
		signal.Ignore(syscall.SIGTERM)
		return context.WithCancel(context.Background())
	}
	return signal.NotifyContext(context.Background(), syscall.SIGTERM)
}

// newWorkerLogger logs hclog-style JSON lines to the process's stderr, which the supervisor
// captures and re-logs.
func newWorkerLogger() *logrus.Entry {
	l := logrus.New()
	l.SetOutput(os.Stderr) // the real stderr: plugin.Serve later swaps the os.Stderr variable
	l.SetFormatter(workerFormatter{})
	l.SetLevel(logrus.InfoLevel)
	if lv, err := logrus.ParseLevel(envconfig.LogLevel.Get()); err == nil {
		l.SetLevel(lv)
	}
	return logrus.NewEntry(l)
}

// Serve builds a worker and serves it over go-plugin until ctx ends, the supervisor shuts the
// server down, or the parent process goes away (ErrOrphaned). Main wraps it; tests call it.
func Serve(ctx context.Context, name string, log *logrus.Entry, newWorker func(*Kit) (Worker, error)) error {
	bw, err := beacon.FromEnv()
	if err != nil {
		return fmt.Errorf("serve %s: %w", name, err)
	}
	defer bw.Close()
	w, err := newWorker(&Kit{Name: name, Log: log, Beacon: bw})
	if err != nil {
		return fmt.Errorf("serve %s: %w", name, err)
	}

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go watchParent(ctx, cancel, parentPID())

	done := make(chan struct{})
	go func() {
		defer close(done)
		plugin.Serve(&plugin.ServeConfig{
			HandshakeConfig: Handshake,
			Plugins:         map[string]plugin.Plugin{PluginName: &Plugin{Impl: w, Beacon: bw, Name: name, Log: log}},
			GRPCServer:      plugin.DefaultGRPCServer,
			Logger:          newHclogBridge(log),
		})
	}()
	bw.SetPhase(beacon.PhaseIdle)
	select {
	case <-done:
		return nil // the supervisor shut the server down
	case <-ctx.Done():
	}
	if cause := context.Cause(ctx); errors.Is(cause, ErrOrphaned) {
		return cause
	}
	log.Info("stopping on signal")
	return nil
}

// parentPID returns the pid the worker's parent must keep: EnvParentPID, else the parent at
// start.
func parentPID() int {
	if pid, err := strconv.Atoi(envconfig.ParentPID.Get()); err == nil && pid > 0 {
		return pid
	}
	return os.Getppid()
}

// watchParent cancels ctx with ErrOrphaned once the process's parent is no longer want.
func watchParent(ctx context.Context, cancel context.CancelCauseFunc, want int) {
	t := time.NewTicker(orphanPoll)
	defer t.Stop()
	for {
		if got := os.Getppid(); got != want {
			cancel(fmt.Errorf("%w: parent pid %d, was %d", ErrOrphaned, got, want))
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
