package workerkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/go-plugin/runner"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/framepackd/framepackd/internal/beacon"
)

// Defaults for Config.
const (
	DefaultStartTimeout = 10 * time.Second
	// reapTimeout bounds the wait for a SIGKILLed process to be reaped (a process stuck in an
	// uninterruptible driver call can take a while to die).
	reapTimeout = 10 * time.Second
	// exitGrace is how long a failed call waits to see whether the worker is dying, so the
	// error can say how it died.
	exitGrace = 250 * time.Millisecond
	// cleanupTimeout bounds go-plugin's own cleanup after the process is gone.
	cleanupTimeout = 5 * time.Second
)

// ErrNoDeadline is returned by a Process call whose context has no deadline.
var ErrNoDeadline = errors.New("worker call without a context deadline")

// Config says how to start one worker process.
type Config struct {
	// Name is the worker's name in logs and errors ("vae", "probe"). REQUIRED.
	Name string
	// Path is the worker binary. REQUIRED.
	Path string
	// Args are extra command-line arguments.
	Args []string
	// Env holds extra KEY=VALUE entries, added after the supervisor's own environment.
	Env []string
	// Dir is the working directory; empty means the supervisor's.
	Dir string
	// StartTimeout bounds the start and the go-plugin handshake; 0 means DefaultStartTimeout.
	StartTimeout time.Duration
	// SocketDir is where go-plugin makes the directory for the worker's unix socket; empty
	// means os.TempDir().
	SocketDir string
	// Log is the base logger; the process adds the fields worker and pid. Nil means the
	// standard logrus logger.
	Log *logrus.Entry
}

// ExitStatus says how a worker process ended.
type ExitStatus struct {
	// Code is the exit code, or -1 when a signal ended the process.
	Code int
	// Signal is the signal that ended the process, 0 if none.
	Signal syscall.Signal
	// Killed is true when the supervisor ended the process (Kill or Close).
	Killed bool
	// Err is a wait failure other than a non-zero status (rare).
	Err error
}

// String describes the status ("exit status 2", "signal: segmentation fault", "killed by
// supervisor").
func (s ExitStatus) String() string {
	var out string
	switch {
	case s.Err != nil:
		out = "wait: " + s.Err.Error()
	case s.Signal != 0:
		out = "signal: " + s.Signal.String()
	default:
		out = "exit status " + strconv.Itoa(s.Code)
	}
	if s.Killed {
		out += " (killed by supervisor)"
	}
	return out
}

// Success reports a clean exit with status 0.
func (s ExitStatus) Success() bool { return s.Err == nil && s.Signal == 0 && s.Code == 0 }

// ExitError is returned by a Process call that failed because the worker process died.
type ExitError struct {
	Worker string
	PID    int
	Status ExitStatus
	// Stderr holds the last error-like lines the worker wrote.
	Stderr []string
	// Err is the call's own error.
	Err error
}

// Error describes the death, the call's error and the worker's last words.
func (e *ExitError) Error() string {
	msg := fmt.Sprintf("worker %s (pid %d) died: %s: %v", e.Worker, e.PID, e.Status, e.Err)
	if len(e.Stderr) > 0 {
		msg += "; stderr: " + strings.Join(e.Stderr, " | ")
	}
	return msg
}

// Unwrap returns the call's own error.
func (e *ExitError) Unwrap() error { return e.Err }

// Process is one running worker, owned by the supervisor: its own process group, SIGKILL on the
// supervisor's death, a reaper, a beacon page and a go-plugin connection. Its Worker methods
// require a context deadline. A Process must be closed.
type Process struct {
	name   string
	log    *logrus.Entry
	page   *beacon.Page
	tail   *stderrTail
	client *plugin.Client
	worker remote

	// r is set by go-plugin's RunnerFunc during Start; Start's success publishes it, and only
	// the start-cancellation path reads it earlier, under rmu.
	rmu sync.Mutex
	r   *procRunner

	killOnce    sync.Once
	cleanupOnce sync.Once
	killed      atomic.Bool
}

var _ remote = (*Process)(nil)

// Start starts the worker binary, completes the go-plugin handshake and returns the process,
// ready for calls. ctx bounds the start (as does cfg.StartTimeout); it does not bound the
// process's life.
func Start(ctx context.Context, cfg Config) (*Process, error) {
	if cfg.Name == "" || cfg.Path == "" {
		return nil, errors.New("start worker: name and path are required")
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	base := cfg.Log
	if base == nil {
		base = logrus.NewEntry(logrus.StandardLogger())
	}
	page, err := beacon.NewPage()
	if err != nil {
		return nil, fmt.Errorf("start worker %s: %w", cfg.Name, err)
	}
	p := &Process{name: cfg.Name, log: base.WithField("worker", cfg.Name), page: page, tail: &stderrTail{}}

	// The log bridge learns the pid once the runner has started the process.
	bridge := newHclogBridge(p.log)
	bridge.src.killed = p.killed.Load
	p.client = plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  Handshake,
		Plugins:          pluginMap(nil),
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		StartTimeout:     cfg.StartTimeout,
		SkipHostEnv:      true, // newProcRunner composes the environment
		Stderr:           p.tail,
		Logger:           bridge,
		UnixSocketConfig: &plugin.UnixSocketConfig{TempDir: cfg.SocketDir},
		RunnerFunc: func(_ hclog.Logger, pcmd *exec.Cmd, _ string) (runner.Runner, error) {
			r, err := newProcRunner(cfg, pcmd.Env, page, p.tail)
			if err != nil {
				return nil, err
			}
			r.onStart = func(pid int) {
				p.log = p.log.WithField("pid", pid)
				bridge.src.set(p.log)
			}
			p.rmu.Lock()
			p.r = r
			p.rmu.Unlock()
			return r, nil
		},
	})

	type dispensed struct {
		w   remote
		err error
	}
	ch := make(chan dispensed, 1)
	go func() {
		cp, err := p.client.Client()
		if err != nil {
			ch <- dispensed{err: err}
			return
		}
		raw, err := cp.Dispense(PluginName)
		if err != nil {
			ch <- dispensed{err: err}
			return
		}
		w, ok := raw.(remote)
		if !ok {
			ch <- dispensed{err: fmt.Errorf("plugin gave %T, not a Worker", raw)}
			return
		}
		ch <- dispensed{w: w}
	}()
	var d dispensed
	select {
	case d = <-ch:
	case <-ctx.Done():
		p.killGroup()
		<-ch
		d.err = ctx.Err()
	}
	if d.err != nil {
		err := d.err
		if p.r != nil {
			p.killGroup()
			if st, ok := p.waitExit(exitGrace); ok {
				err = &ExitError{Worker: p.name, PID: p.r.pid, Status: st, Stderr: p.exitTail(), Err: err}
			}
		}
		p.Close()
		return nil, fmt.Errorf("start worker %s: %w", cfg.Name, err)
	}
	p.worker = d.w
	p.log.Debug("worker ready")
	return p, nil
}

// Name returns the worker's name.
func (p *Process) Name() string { return p.name }

// PID returns the worker's pid (also its process group id).
func (p *Process) PID() int { return p.r.pid }

// Done is closed when the process has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.r.done }

// Exited reports whether the process has exited, and how.
func (p *Process) Exited() (ExitStatus, bool) {
	if p.r == nil {
		return ExitStatus{}, false
	}
	select {
	case <-p.r.done:
		return p.r.status(p.killed.Load()), true
	default:
		return ExitStatus{}, false
	}
}

// Beacon reads the worker's beacon page. It stays readable after the process died, until Close.
func (p *Process) Beacon() (beacon.Snapshot, error) { return p.page.Snapshot() }

// StderrTail returns the last error-like lines the worker wrote to stderr.
func (p *Process) StderrTail() []string { return p.tail.Lines() }

// killGroup sends SIGKILL to the worker's whole process group, once; if the process is still
// being started, as soon as it has started.
func (p *Process) killGroup() {
	p.rmu.Lock()
	r := p.r
	p.rmu.Unlock()
	if r == nil {
		return
	}
	p.killOnce.Do(func() {
		p.killed.Store(true)
		r.killGroup()
	})
}

// waitExit waits up to d for the process to be reaped.
func (p *Process) waitExit(d time.Duration) (ExitStatus, bool) {
	if p.r == nil {
		return ExitStatus{}, false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.r.done:
		return p.r.status(p.killed.Load()), true
	case <-t.C:
		return ExitStatus{}, false
	}
}

// stderrDrain bounds how long an exited worker's last stderr lines are waited for.
const stderrDrain = time.Second

// exitTail returns the last stderr lines of a worker that has exited, once go-plugin has read
// its stderr to the end (a crash's last words are still in the pipe when the process is
// reaped), or after stderrDrain.
func (p *Process) exitTail() []string {
	t := time.NewTimer(stderrDrain)
	defer t.Stop()
	select {
	case <-p.r.stderrEOF:
	case <-t.C:
	}
	return p.tail.Lines()
}

// Kill sends SIGKILL to the worker's process group, waits for the worker to be reaped and
// releases the connection. It is safe to call more than once and after the worker died.
func (p *Process) Kill() error {
	if p.r == nil {
		return nil
	}
	if _, ok := p.Exited(); !ok {
		p.killGroup()
	}
	if _, ok := p.waitExit(reapTimeout); !ok {
		return fmt.Errorf("kill worker %s (pid %d): not reaped %v after SIGKILL", p.name, p.r.pid, reapTimeout)
	}
	p.cleanup()
	return nil
}

// cleanup lets go-plugin end its goroutines and remove its socket directory. If something
// outside the process group still holds the worker's stdout or stderr, closing our ends
// unblocks it.
func (p *Process) cleanup() {
	p.cleanupOnce.Do(func() {
		done := make(chan struct{})
		go func() { p.client.Kill(); close(done) }()
		select {
		case <-done:
		case <-time.After(cleanupTimeout):
			p.r.closeReaders()
			<-done
		}
		p.r.closeReaders()
	})
}

// Close kills the worker if it still runs, releases everything and logs how it ended.
func (p *Process) Close() error {
	err := p.Kill()
	if st, ok := p.Exited(); ok {
		p.log.WithField("status", st.String()).Debug("worker closed")
	}
	if cerr := p.page.Close(); err == nil {
		err = cerr
	}
	return err
}

// call runs fn with the deadline rule and explains failures caused by the worker's death.
func (p *Process) call(ctx context.Context, what string, fn func() error) error {
	if _, ok := ctx.Deadline(); !ok {
		return fmt.Errorf("worker %s: %s: %w", p.name, what, ErrNoDeadline)
	}
	err := fn()
	if err == nil {
		return nil
	}
	var we *Error
	if errors.As(err, &we) {
		return err // the worker answered with a classified error
	}
	if st, ok := p.waitExit(exitGrace); ok {
		return &ExitError{Worker: p.name, PID: p.r.pid, Status: st, Stderr: p.exitTail(), Err: fmt.Errorf("%s: %w", what, err)}
	}
	return fmt.Errorf("worker %s: %s: %w", p.name, what, err)
}

// Load calls the worker's Load.
func (p *Process) Load(ctx context.Context, req *LoadRequest) (resp *LoadResponse, err error) {
	err = p.call(ctx, "load", func() error { resp, err = p.worker.Load(ctx, req); return err })
	return resp, err
}

// Run calls the worker's Run; emit receives the stage's events as they come.
func (p *Process) Run(ctx context.Context, req *RunRequest, emit Emit) (res *Result, err error) {
	err = p.call(ctx, "run", func() error { res, err = p.worker.Run(ctx, req, emit); return err })
	return res, err
}

// Stats calls the worker's Stats.
func (p *Process) Stats(ctx context.Context) (st *Stats, err error) {
	err = p.call(ctx, "stats", func() error { st, err = p.worker.Stats(ctx); return err })
	return st, err
}

// Estimate calls the worker's Estimate (ErrNoEstimate when it has none).
func (p *Process) Estimate(ctx context.Context, req *EstimateRequest) (resp *EstimateResponse, err error) {
	err = p.call(ctx, "estimate", func() error { resp, err = p.worker.Estimate(ctx, req); return err })
	return resp, err
}

// Probe calls the worker's Probe.
func (p *Process) Probe(ctx context.Context, req *ProbeRequest) (resp *ProbeResponse, err error) {
	err = p.call(ctx, "probe", func() error { resp, err = p.worker.Probe(ctx, req); return err })
	return resp, err
}

// procRunner is go-plugin's view of our process: we start it (from a locked OS thread, so
// Pdeathsig stays tied to a thread that lives as long as the worker), reap it, and kill its
// whole group.
type procRunner struct {
	cmd     *exec.Cmd
	tail    *stderrTail
	onStart func(pid int)

	stdoutR, stdoutW *os.File
	stderrR, stderrW *os.File

	mu      sync.Mutex    // mu protects killReq and pid while the process starts
	killReq bool          // a kill was asked for; applied as soon as the process exists
	pid     int           // written once under mu before Start returns; read freely after
	done    chan struct{} // closed after the process is reaped
	waitErr error         // set before done is closed
	state   *os.ProcessState

	// stderrEOF is closed once go-plugin's reader of stderr has hit its end (every writer of
	// the pipe gone): every complete line the worker wrote is in tail by then.
	stderrEOF  chan struct{}
	stderrOnce sync.Once

	closeOnce sync.Once
}

var _ runner.Runner = (*procRunner)(nil)

func newProcRunner(cfg Config, pluginEnv []string, page *beacon.Page, tail *stderrTail) (*procRunner, error) {
	cmd := exec.Command(cfg.Path, cfg.Args...)
	cmd.Dir = cfg.Dir
	cmd.Env = append(append(append(os.Environ(), cfg.Env...), pluginEnv...),
		beacon.EnvFD+"=3",
		EnvParentPID+"="+strconv.Itoa(os.Getpid()),
	)
	cmd.ExtraFiles = []*os.File{page.File()} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	r := &procRunner{cmd: cmd, tail: tail, done: make(chan struct{}), stderrEOF: make(chan struct{})}
	var err error
	if r.stdoutR, r.stdoutW, err = os.Pipe(); err != nil {
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	if r.stderrR, r.stderrW, err = os.Pipe(); err != nil {
		r.stdoutR.Close()
		r.stdoutW.Close()
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	cmd.Stdout, cmd.Stderr = r.stdoutW, r.stderrW
	cmd.Stdin = nil // go-plugin sets its own; ours must not read the supervisor's stdin
	return r, nil
}

// Start starts the process from a goroutine locked to its OS thread. The goroutine then stays
// to reap the process, so the thread (whose death would fire Pdeathsig) lives exactly as long
// as the worker.
func (r *procRunner) Start(context.Context) error {
	r.cmd.Stdin = nil
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		err := r.cmd.Start()
		r.stdoutW.Close() // the child has its copies now
		r.stderrW.Close()
		if err != nil {
			r.waitErr = err
			close(r.done)
			started <- err
			return
		}
		r.mu.Lock()
		r.pid = r.cmd.Process.Pid
		if r.killReq {
			_ = syscall.Kill(-r.pid, syscall.SIGKILL)
		}
		r.mu.Unlock()
		started <- nil
		r.reap()
	}()
	if err := <-started; err != nil {
		r.closeReaders()
		return fmt.Errorf("start %s: %w", r.cmd.Path, err)
	}
	if r.onStart != nil {
		r.onStart(r.pid)
	}
	return nil
}

// reap waits for the worker to exit, kills what is left of its process group while the
// group id cannot yet be reused (the leader is not reaped), then reaps it.
func (r *procRunner) reap() {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, r.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	r.killGroup()
	r.waitErr = r.cmd.Wait()
	r.state = r.cmd.ProcessState
	close(r.done)
}

// killGroup sends SIGKILL to the process group, or makes the start do so.
func (r *procRunner) killGroup() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killReq = true
	if r.pid > 0 {
		_ = syscall.Kill(-r.pid, syscall.SIGKILL)
	}
}

// status says how the process ended; valid after done.
func (r *procRunner) status(killed bool) ExitStatus {
	st := ExitStatus{Killed: killed, Code: -1}
	if r.state == nil {
		st.Err = r.waitErr
		return st
	}
	if ws, ok := r.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		st.Signal = ws.Signal()
		return st
	}
	st.Code = r.state.ExitCode()
	return st
}

func (r *procRunner) closeReaders() {
	r.closeOnce.Do(func() {
		r.stdoutR.Close()
		r.stderrR.Close()
	})
}

// Wait waits for the process to be reaped.
func (r *procRunner) Wait(context.Context) error {
	<-r.done
	return r.waitErr
}

// Kill sends SIGKILL to the process group.
func (r *procRunner) Kill(context.Context) error {
	r.killGroup()
	return nil
}

// Stdout is the worker's stdout, where go-plugin reads the handshake line.
func (r *procRunner) Stdout() io.ReadCloser { return r.stdoutR }

// Stderr is the worker's stderr, which go-plugin logs and tails.
func (r *procRunner) Stderr() io.ReadCloser {
	return eofReader{ReadCloser: r.stderrR, eof: func() { r.stderrOnce.Do(func() { close(r.stderrEOF) }) }}
}

// eofReader calls eof when a Read ends the stream (io.EOF or another error).
type eofReader struct {
	io.ReadCloser
	eof func()
}

func (e eofReader) Read(p []byte) (int, error) {
	n, err := e.ReadCloser.Read(p)
	if err != nil {
		e.eof()
	}
	return n, err
}

// Name is the binary's path.
func (r *procRunner) Name() string { return r.cmd.Path }

// ID is the pid.
func (r *procRunner) ID() string { return strconv.Itoa(r.pid) }

// Diagnose returns the worker's last stderr lines, for a failed handshake.
func (r *procRunner) Diagnose(context.Context) string {
	if lines := r.tail.Lines(); len(lines) > 0 {
		return "worker stderr: " + strings.Join(lines, " | ")
	}
	return ""
}

// PluginToHost keeps addresses as they are (same host, same filesystem).
func (r *procRunner) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

// HostToPlugin keeps addresses as they are.
func (r *procRunner) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}
