package workerkit_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/testbin"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// deadline is the per-call timeout of these tests.
const deadline = 10 * time.Second

func callCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// startProbe starts the real probe worker; extra env entries are KEY=VALUE.
func startProbe(t *testing.T, env ...string) (*workerkit.Process, *test.Hook) {
	t.Helper()
	return start(t, workerkit.Config{Name: "probe", Path: testbin.Build(t, "./workers/probe"), Env: env})
}

// startFake starts the test binary as the fake model worker.
func startFake(t *testing.T) (*workerkit.Process, *test.Hook) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return start(t, workerkit.Config{Name: "fake", Path: exe, Args: []string{"-test.run=^$"}, Env: []string{helperEnv + "=fake-worker"}})
}

func start(t *testing.T, cfg workerkit.Config) (*workerkit.Process, *test.Hook) {
	t.Helper()
	log, hook := test.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	cfg.Log = logrus.NewEntry(log)
	cfg.SocketDir = t.TempDir()
	p, err := workerkit.Start(callCtx(t), cfg)
	if err != nil {
		t.Fatalf("start %s: %v", cfg.Name, err)
	}
	t.Cleanup(func() { p.Close() })
	return p, hook
}

// gone reports whether pid no longer runs: no such process, or a zombie nobody reaped yet.
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] == 'Z' || s[i+2] == 'X'
}

// waitGone polls until pid is gone or d passes; it returns how long that took.
func waitGone(pid int, d time.Duration) (time.Duration, bool) {
	start := time.Now()
	for time.Since(start) < d {
		if gone(pid) {
			return time.Since(start), true
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), gone(pid)
}

// TestProbeLifecycle starts the real probe worker, probes the CPU with an allocation test,
// reads its beacon and stats, and kills it.
func TestProbeLifecycle(t *testing.T) {
	p, hook := startProbe(t)
	pid := p.PID()
	if pid <= 0 || gone(pid) {
		t.Fatalf("pid %d not running", pid)
	}
	pgid, err := syscall.Getpgid(pid)
	if err != nil || pgid != pid {
		t.Fatalf("worker's process group %d (%v), want its own (%d)", pgid, err, pid)
	}

	const alloc = 64 << 20
	resp, err := p.Probe(callCtx(t), &workerkit.ProbeRequest{Backend: "cpu", AllocateBytes: alloc})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Backend != "cpu" || len(resp.Devices) != 1 {
		t.Fatalf("probe: %+v", resp)
	}
	dev := resp.Devices[0]
	if dev.Name == "" || dev.Arch == "" || dev.TotalMemoryBytes == 0 || dev.FreeMemoryBytes == 0 || dev.FreeMemoryBytes > dev.TotalMemoryBytes {
		t.Fatalf("cpu device: %+v", dev)
	}
	if resp.Allocate == nil || !resp.Allocate.Succeeded || resp.Allocate.Duration <= 0 {
		t.Fatalf("allocate: %+v", resp.Allocate)
	}
	t.Logf("probe: %s, %s, %d MiB total, %d MiB available; allocate 64 MiB in %v",
		dev.Name, dev.Arch, dev.TotalMemoryBytes>>20, dev.FreeMemoryBytes>>20, resp.Allocate.Duration)

	bad, err := p.Probe(callCtx(t), &workerkit.ProbeRequest{Backend: "cpu", AllocateBytes: 1, AllocateDeviceIndex: 3})
	if err != nil || bad.Allocate == nil || bad.Allocate.Succeeded || bad.Allocate.Error == "" {
		t.Fatalf("allocate on a missing device: %+v, %v", bad, err)
	}
	if _, err := p.Probe(callCtx(t), &workerkit.ProbeRequest{Backend: "cuda"}); workerkit.CodeOf(err) != workerkit.CodeInternal {
		t.Fatalf("cuda probe in a cpu build: %v", err)
	}

	snap, err := p.Beacon()
	if err != nil {
		t.Fatal(err)
	}
	if snap.PID != pid || snap.Phase != beacon.PhaseIdle || snap.OpSeq != 1 || snap.Op != "probe.allocate" || snap.InOp || snap.PeakBytes != alloc {
		t.Fatalf("beacon after probe: %+v", snap)
	}

	st, err := p.Stats(callCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if st.HostRSSBytes == 0 || st.AllocatorPeakBytes != alloc {
		t.Fatalf("stats: %+v", st)
	}

	// The probe refuses model calls with a classified error.
	if _, err := p.Load(callCtx(t), &workerkit.LoadRequest{ModelDir: "/x"}); workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
		t.Fatalf("load on probe: %v", err)
	}
	// Every call needs a deadline.
	if _, err := p.Stats(context.Background()); !errors.Is(err, workerkit.ErrNoDeadline) {
		t.Fatalf("call without deadline: %v", err)
	}

	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if !gone(pid) {
		t.Fatal("probe still running after Kill")
	}
	ex, ok := p.Exited()
	if !ok || !ex.Killed || ex.Signal != syscall.SIGKILL {
		t.Fatalf("exit status %+v (%v)", ex, ok)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Fatalf("probe not reaped: kill 0: %v", err)
	}
	if _, err := p.Stats(callCtx(t)); err == nil {
		t.Fatal("call after Kill succeeded")
	}
	if err := p.Kill(); err != nil {
		t.Fatalf("second Kill: %v", err)
	}
	if snap, err := p.Beacon(); err != nil || snap.PID != pid {
		t.Fatalf("beacon after death: %+v %v", snap, err)
	}
	// Logs carry the worker's name and pid.
	found := false
	for _, e := range hook.AllEntries() {
		if e.Data["worker"] == "probe" && e.Data["pid"] == pid {
			found = true
		}
	}
	if !found {
		t.Fatalf("no log entry with worker=probe pid=%d among %d", pid, len(hook.AllEntries()))
	}
}

// TestKillIgnoresSIGTERM starts a probe that ignores SIGTERM: SIGTERM leaves it running, Kill
// ends it anyway.
func TestKillIgnoresSIGTERM(t *testing.T) {
	p, _ := startProbe(t, workerkit.EnvTestIgnoreSIGTERM+"=1")
	if err := syscall.Kill(p.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The worker must still answer after SIGTERM.
	if _, err := p.Stats(callCtx(t)); err != nil {
		t.Fatalf("stats after ignored SIGTERM: %v", err)
	}
	if _, exited := p.Exited(); exited {
		t.Fatal("worker exited on an ignored SIGTERM")
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if ex, _ := p.Exited(); ex.Signal != syscall.SIGKILL || !gone(p.PID()) {
		t.Fatalf("after Kill: %+v", ex)
	}
}

// TestSIGTERMStopsWorker checks that a worker exits cleanly on SIGTERM.
func TestSIGTERMStopsWorker(t *testing.T) {
	p, _ := startProbe(t)
	if err := syscall.Kill(p.PID(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(deadline):
		t.Fatal("worker did not exit on SIGTERM")
	}
	if ex, _ := p.Exited(); !ex.Success() || ex.Killed {
		t.Fatalf("exit status after SIGTERM: %+v", ex)
	}
}

// TestSupervisorDeathKillsWorker runs a fake supervisor process that starts the probe, kills
// the supervisor with SIGKILL, and checks the probe is gone within 2 s.
func TestSupervisorDeathKillsWorker(t *testing.T) {
	probe := testbin.Build(t, "./workers/probe")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	sup := exec.Command(exe, "-test.run=^$")
	sup.Env = append(os.Environ(), helperEnv+"=supervisor "+probe+" "+t.TempDir())
	sup.Stderr = os.Stderr
	out, err := sup.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sup.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sup.Process.Kill(); sup.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("fake supervisor said %q: %v", line, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || gone(pid) {
		t.Fatalf("probe pid %q not running (%v)", line, err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) }) // only if the test failed

	if err := sup.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	sup.Wait()
	took, ok := waitGone(pid, 2*time.Second)
	if !ok {
		t.Fatalf("probe %d still running 2 s after its supervisor was killed", pid)
	}
	t.Logf("probe gone %v after the supervisor's SIGKILL", took.Round(time.Millisecond))
}

// TestOrphanedWorkerExits starts the probe without a parent-death signal from a short-lived
// parent: the worker's own parent check must end it.
func TestOrphanedWorkerExits(t *testing.T) {
	probe := testbin.Build(t, "./workers/probe")
	// sh starts the probe in the background with the handshake environment, prints its pid
	// and exits, orphaning it.
	sh := exec.Command("/bin/sh", "-c", `"$0" </dev/null >/dev/null 2>&1 & echo $!; sleep 0.3`, probe)
	sh.Env = append(os.Environ(),
		workerkit.Handshake.MagicCookieKey+"="+workerkit.Handshake.MagicCookieValue,
		"PLUGIN_PROTOCOL_VERSIONS=1",
		"PLUGIN_UNIX_SOCKET_DIR="+t.TempDir(),
	)
	out, err := sh.Output()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("pid %q: %v", out, err)
	}
	t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
	took, ok := waitGone(pid, 5*time.Second)
	if !ok {
		t.Fatalf("orphaned probe %d still running", pid)
	}
	t.Logf("orphaned probe exited %v after its parent", took.Round(time.Millisecond))
}

// TestRunStreamsEvents runs a stage on the fake worker: progress and log events arrive in order,
// the result comes back, the beacon followed the steps.
func TestRunStreamsEvents(t *testing.T) {
	p, _ := startFake(t)
	if _, err := p.Run(callCtx(t), &workerkit.RunRequest{Stage: &workerkit.TextEncodeRequest{Prompt: "x"}}, nil); err == nil || !strings.Contains(err.Error(), "not been loaded") {
		t.Fatalf("run before load: %v", err)
	}
	if _, err := p.Load(callCtx(t), &workerkit.LoadRequest{}); workerkit.CodeOf(err) != workerkit.CodeInvalidArgument {
		t.Fatalf("bad load: %v", err)
	}
	if _, err := p.Load(callCtx(t), &workerkit.LoadRequest{ModelDir: "/models/x"}); err == nil || !strings.Contains(err.Error(), "already") {
		t.Fatalf("second load: %v", err)
	}

	p2, _ := startFake(t)
	lr, err := p2.Load(callCtx(t), &workerkit.LoadRequest{ModelDir: "/models/x", Backend: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	if lr.Backend != "cpu" || lr.WeightBytes != 1234 || lr.Device == nil || lr.Device.Name != "fake" {
		t.Fatalf("load response %+v", lr)
	}
	var events []workerkit.Event
	ref := workerkit.TensorRef{Path: "/dev/shm/x/llama.safetensors", Name: "llama_vec"}
	res, err := p2.Run(callCtx(t), &workerkit.RunRequest{JobID: "j1", Stage: &workerkit.TextEncodeRequest{Prompt: "a cat", LlamaVec: ref}},
		func(e workerkit.Event) error { events = append(events, e); return nil })
	if err != nil {
		t.Fatal(err)
	}
	var steps []uint32
	for _, e := range events {
		if pr, ok := e.(*workerkit.Progress); ok {
			steps = append(steps, pr.Step)
		}
	}
	if !slices.Equal(steps, []uint32{1, 2, 3}) || len(events) != 4 {
		t.Fatalf("events: %d, steps %v", len(events), steps)
	}
	if l, ok := events[3].(*workerkit.LogLine); !ok || l.Level != workerkit.LogWarn || l.Fields["tokens"] != "300" {
		t.Fatalf("log event: %#v", events[3])
	}
	if len(res.Outputs) != 1 || res.Outputs[0].Path != ref.Path || !slices.Equal(res.Outputs[0].Shape, []int64{1, 512, 4096}) || res.Stats.OpCounts["gemm"] != 3 {
		t.Fatalf("result: %+v", res)
	}
	snap, err := p2.Beacon()
	if err != nil {
		t.Fatal(err)
	}
	if snap.OpSeq != 3 || snap.Op != "step-3" || snap.Step != 3 || snap.Steps != 3 || snap.Phase != beacon.PhaseIdle {
		t.Fatalf("beacon after run: %+v", snap)
	}

	// A typed error crosses the process boundary with its code and sizes.
	_, err = p2.Run(callCtx(t), &workerkit.RunRequest{Stage: &workerkit.TextEncodeRequest{Prompt: "oom"}}, nil)
	var we *workerkit.Error
	if !errors.As(err, &we) || we.Code != workerkit.CodeOutOfMemory || we.RequestedBytes != 4096 || we.AvailableBytes != 1024 || !strings.Contains(we.Message, "encode llama") {
		t.Fatalf("oom: %#v", err)
	}
	// An event handler's error stops the run.
	stop := errors.New("enough")
	if _, err := p2.Run(callCtx(t), &workerkit.RunRequest{Stage: &workerkit.TextEncodeRequest{}}, func(workerkit.Event) error { return stop }); !errors.Is(err, stop) {
		t.Fatalf("handler error: %v", err)
	}
}

// TestHangIsVisibleAndKillable runs a stage that never returns: the call ends at its deadline,
// the beacon shows the stuck op, and Kill ends the worker.
// TestPanicBecomesInternal checks that a panic in a worker's Load or Run answers the call with
// CodeInternal (logged with its stack) and leaves the worker serving, and that a model worker,
// which has no Probe, refuses a probe.
func TestPanicBecomesInternal(t *testing.T) {
	p, _ := startFake(t)
	if _, err := p.Load(callCtx(t), &workerkit.LoadRequest{ModelDir: "panic"}); workerkit.CodeOf(err) != workerkit.CodeInternal ||
		!strings.Contains(err.Error(), "assignment to entry in nil map") {
		t.Fatalf("load that panics: %v", err)
	}
	if _, err := p.Stats(callCtx(t)); err != nil {
		t.Fatalf("stats after a panic: %v", err)
	}

	p2, hook := startFake(t)
	if _, err := p2.Load(callCtx(t), &workerkit.LoadRequest{ModelDir: "/models/x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Run(callCtx(t), &workerkit.RunRequest{Stage: &workerkit.TextEncodeRequest{Prompt: "panic"}}, nil); workerkit.CodeOf(err) != workerkit.CodeInternal ||
		!strings.Contains(err.Error(), "run: internal error: fake bug in run") {
		t.Fatalf("run that panics: %v", err)
	}
	if _, err := p2.Run(callCtx(t), &workerkit.RunRequest{Stage: &workerkit.TextEncodeRequest{Prompt: "a cat"}}, nil); err != nil {
		t.Fatalf("run after a panic: %v", err)
	}
	if _, err := p2.Probe(callCtx(t), &workerkit.ProbeRequest{Backend: "cpu"}); workerkit.CodeOf(err) != workerkit.CodeInvalidArgument ||
		!strings.Contains(err.Error(), "the fake worker does not probe devices") {
		t.Fatalf("probe of a model worker: %v", err)
	}
	if st, exited := p2.Exited(); exited {
		t.Fatalf("worker exited after a panic: %v", st)
	}
	logged := false
	for _, e := range hook.AllEntries() {
		logged = logged || strings.Contains(e.Message, "panic recovered")
	}
	if !logged {
		t.Error("the panic's stack did not reach the supervisor's log")
	}
}

func TestHangIsVisibleAndKillable(t *testing.T) {
	p, _ := startFake(t)
	if _, err := p.Load(callCtx(t), &workerkit.LoadRequest{ModelDir: "/m"}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	_, err := p.Run(ctx, &workerkit.RunRequest{Stage: &workerkit.TextEncodeRequest{Prompt: "hang"}}, nil)
	if workerkit.CodeOf(err) != workerkit.CodeCancelled {
		t.Fatalf("hung run: %v", err)
	}
	snap, err := p.Beacon()
	if err != nil {
		t.Fatal(err)
	}
	if !snap.InOp || snap.Op != "conv3d.hang" || snap.Phase != beacon.PhaseRunning || snap.OpAge(time.Now()) < 200*time.Millisecond {
		t.Fatalf("beacon of hung worker: %+v", snap)
	}
	if err := p.Kill(); err != nil {
		t.Fatal(err)
	}
	if ex, _ := p.Exited(); ex.Signal != syscall.SIGKILL {
		t.Fatalf("status %+v", ex)
	}
}

// TestCrashReportsStatusAndStderr checks the error of a call during which the worker dies.
func TestCrashReportsStatusAndStderr(t *testing.T) {
	p, _ := startFake(t)
	if _, err := p.Load(callCtx(t), &workerkit.LoadRequest{ModelDir: "/m"}); err != nil {
		t.Fatal(err)
	}
	_, err := p.Run(callCtx(t), &workerkit.RunRequest{Stage: &workerkit.TextEncodeRequest{Prompt: "crash"}}, nil)
	var ee *workerkit.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("want ExitError, got %v", err)
	}
	if ee.Status.Code != 3 || ee.Status.Killed || ee.PID != p.PID() {
		t.Fatalf("status %+v", ee.Status)
	}
	if len(ee.Stderr) == 0 || !strings.Contains(strings.Join(ee.Stderr, "|"), "device on fire") {
		t.Fatalf("stderr tail %q", ee.Stderr)
	}
	t.Log(err)
}

// TestStartFailures covers binaries that are not workers and a start cancelled by its context.
func TestStartFailures(t *testing.T) {
	log, _ := test.NewNullLogger()
	tests := []struct {
		name    string
		path    string
		args    []string
		timeout time.Duration
		want    string
	}{
		{"missing binary", "/nonexistent/worker", nil, deadline, "no such file"},
		{"exits at once", "/bin/false", nil, deadline, "exit status 1"},
		{"not a plugin", "/bin/echo", []string{"hello"}, deadline, "hello"},
		{"never answers", "/bin/sleep", []string{"30"}, 300 * time.Millisecond, "deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), tt.timeout)
			defer cancel()
			start := time.Now()
			p, err := workerkit.Start(ctx, workerkit.Config{Name: "bad", Path: tt.path, Args: tt.args, Log: logrus.NewEntry(log), SocketDir: t.TempDir()})
			if err == nil {
				p.Close()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q does not mention %q", err, tt.want)
			}
			if took := time.Since(start); took > tt.timeout+5*time.Second {
				t.Fatalf("start took %v", took)
			}
		})
	}
}

// BenchmarkSpawn measures a worker's spawn-to-ready time: process start, go-plugin handshake
// and the first answered call (Stats), then the kill. The goal is under 50 ms.
func BenchmarkSpawn(b *testing.B) {
	path := testbin.Build(b, "./workers/probe")
	log, _ := test.NewNullLogger()
	dir := b.TempDir()
	var ready, total time.Duration
	for b.Loop() {
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		p, err := workerkit.Start(ctx, workerkit.Config{Name: "probe", Path: path, Log: logrus.NewEntry(log), SocketDir: dir})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := p.Stats(ctx); err != nil {
			b.Fatal(err)
		}
		ready += time.Since(t0)
		cancel()
		if err := p.Close(); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
	}
	b.ReportMetric(float64(ready.Microseconds())/1000/float64(b.N), "ms-to-ready")
	b.ReportMetric(float64((total-ready).Microseconds())/1000/float64(b.N), "ms-to-kill")
}

// TestWorkerSurvivesStarterThreadExit starts a worker from a goroutine locked to its OS thread
// that then exits, which ends that thread. Pdeathsig is tied to the forking thread, so a worker
// forked from it would be killed; ours is forked from a thread that lives as long as the worker.
func TestWorkerSurvivesStarterThreadExit(t *testing.T) {
	path := testbin.Build(t, "./workers/probe")
	log, _ := test.NewNullLogger()
	type started struct {
		p   *workerkit.Process
		err error
	}
	ch := make(chan started)
	go func() {
		runtime.LockOSThread() // never unlocked: this thread exits with the goroutine
		p, err := workerkit.Start(callCtx(t), workerkit.Config{Name: "probe", Path: path, Log: logrus.NewEntry(log), SocketDir: t.TempDir()})
		ch <- started{p, err}
	}()
	s := <-ch
	if s.err != nil {
		t.Fatal(s.err)
	}
	defer s.p.Close()
	// Churn threads: a goroutine that exits locked ends its thread, whichever pooled thread the
	// scheduler gave it, so a worker forked from an ordinary pooled thread would likely die here.
	for i := 0; i < 64; i++ {
		done := make(chan struct{})
		go func() { runtime.LockOSThread(); close(done) }()
		<-done
	}
	time.Sleep(100 * time.Millisecond) // let the exited threads go and any signal land
	if _, err := s.p.Stats(callCtx(t)); err != nil {
		t.Fatalf("worker died with its starter's thread: %v", err)
	}
	if _, exited := s.p.Exited(); exited {
		t.Fatal("worker exited")
	}
}

// TestExitLogLevel checks how go-plugin's "plugin process exited" line reaches the log: at
// debug level when the supervisor killed the worker (every normal teardown), at error level when
// the worker died by itself.
func TestExitLogLevel(t *testing.T) {
	exitEntry := func(t *testing.T, hook *test.Hook) *logrus.Entry {
		t.Helper()
		for _, e := range hook.AllEntries() {
			if e.Message == "plugin process exited" {
				return e
			}
		}
		t.Fatalf("no %q entry among %d", "plugin process exited", len(hook.AllEntries()))
		return nil
	}
	t.Run("killed", func(t *testing.T) {
		p, hook := startProbe(t)
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		if e := exitEntry(t, hook); e.Level != logrus.DebugLevel {
			t.Fatalf("exit after Kill logged at %s: %v", e.Level, e.Data)
		}
		for _, e := range hook.AllEntries() {
			if e.Level <= logrus.ErrorLevel {
				t.Errorf("error entry on a normal teardown: %q %v", e.Message, e.Data)
			}
		}
	})
	t.Run("crashed", func(t *testing.T) {
		p, hook := startFake(t)
		if _, err := p.Load(callCtx(t), &workerkit.LoadRequest{ModelDir: "/m"}); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Run(callCtx(t), &workerkit.RunRequest{Stage: &workerkit.TextEncodeRequest{Prompt: "crash"}}, nil); err == nil {
			t.Fatal("crash stage succeeded")
		}
		if err := p.Kill(); err != nil {
			t.Fatal(err)
		}
		if e := exitEntry(t, hook); e.Level != logrus.ErrorLevel {
			t.Fatalf("exit of a crashed worker logged at %s: %v", e.Level, e.Data)
		}
	})
}
