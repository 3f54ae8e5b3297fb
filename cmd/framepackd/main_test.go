package main

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/apiaddr"
	"github.com/framepackd/framepackd/internal/testbin"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

type daemonFixture struct {
	bin, workers, dir, state, socket, shmRoot string
	lastHealth                                healthpb.HealthCheckResponse_ServingStatus
	env                                       []string // extra environment of the daemon
}

func newFixture(t *testing.T) *daemonFixture {
	t.Helper()
	bin := testbin.Build(t, "./cmd/framepackd")
	probe := testbin.Build(t, "./workers/probe")
	dir, err := os.MkdirTemp("", "fpkd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &daemonFixture{bin: bin, dir: dir, workers: filepath.Join(dir, "workers"), state: filepath.Join(dir, "state"),
		socket: filepath.Join(dir, "d.sock"), shmRoot: filepath.Join(dir, "shm")}
	if err := os.MkdirAll(f.workers, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(probe, filepath.Join(f.workers, "probe")); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *daemonFixture) args(extra ...string) []string {
	return append([]string{"--state", f.state, "--socket", f.socket, "--workers-dir", f.workers, "--shm-root", f.shmRoot,
		"--models", filepath.Join(f.dir, "models"), "--grace", "2s", "--log-format", "json"}, extra...)
}

// start starts the daemon and waits until its health service answers: SERVING, or
// NOT_SERVING for a daemon that cannot run jobs (no models); lastHealth keeps the answer.
func (f *daemonFixture) start(t *testing.T, extra ...string) (*exec.Cmd, *testbin.Output, *grpc.ClientConn) {
	t.Helper()
	cmd := exec.Command(f.bin, f.args(extra...)...)
	cmd.Env = append(os.Environ(), f.env...)
	logs := &testbin.Output{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			cmd.Process.Kill()
			cmd.Wait()
		}
	})
	conn, err := grpc.NewClient(api.Addr{Network: "unix", Address: f.socket}.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("daemon not serving: %v %v\nlogs:\n%s", resp, err, logs.String())
	}
	f.lastHealth = resp.GetStatus()
	return cmd, logs, conn
}

func stop(t *testing.T, cmd *exec.Cmd, logs *testbin.Output) {
	t.Helper()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("daemon exit after SIGTERM: %v\nlogs:\n%s", err, logs.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("daemon did not stop after SIGTERM\nlogs:\n%s", logs.String())
	}
}

func TestDaemon(t *testing.T) {
	f := newFixture(t)
	// A shared-memory directory of a supervisor that died long ago.
	stale := filepath.Join(f.shmRoot, "deadjob000")
	if err := os.MkdirAll(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(stale, old, old); err != nil {
		t.Fatal(err)
	}

	cmd, logs, conn := f.start(t)
	if st, err := os.Stat(f.socket); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v %v", st.Mode(), err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale shm directory kept: %v", err)
	}
	for _, want := range []string{`"msg":"removed stale shared-memory directories"`, `"msg":"device found"`, `"lane":"cpu"`, `"msg":"framepackd ready"`} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("logs lack %s:\n%s", want, logs.String())
		}
	}

	// Devices come from the probe worker.
	devs, err := framepackv1.NewDeviceServiceClient(conn).ListDevices(t.Context(), &framepackv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(devs.GetDevices()) != 1 {
		t.Fatalf("devices %v", devs)
	}
	// Without models the lane is not serving, and says why (issue 32: it said "healthy").
	d := devs.GetDevices()[0]
	if d.GetLane() != "cpu" || d.GetBackend() != "cpu" || d.GetName() == "" || d.GetTotalMemoryBytes() == 0 ||
		d.GetLaneState() != framepackv1.LaneState_LANE_STATE_NOT_SERVING || !strings.Contains(d.GetLaneStateReason(), "no variant can run") ||
		devs.GetNotServingReason() != d.GetLaneStateReason() {
		t.Fatalf("cpu device without models %v", devs)
	}

	// Without models the daemon is not ready: health says NOT_SERVING and a job is refused at
	// submit, saying why, instead of being accepted to fail later.
	if f.lastHealth != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("health without models: %v, want NOT_SERVING", f.lastHealth)
	}
	client := framepackv1.NewJobServiceClient(conn)
	img, err := os.ReadFile(filepath.Join("..", "..", "internal", "imageproc", "testdata", "decode", "go_rgb16.png"))
	if err != nil {
		t.Skipf("test image: %v", err)
	}
	_, err = client.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: img, Spec: &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1}})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "no variant can run") || !strings.Contains(err.Error(), "model") {
		t.Fatalf("submit without models: %v", err)
	}

	// One daemon per socket.
	second := exec.Command(f.bin, append(f.args(), "--state", filepath.Join(f.dir, "state2"))...)
	out, err := second.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "in use") {
		t.Fatalf("second daemon: %v\n%s", err, out)
	}

	stop(t, cmd, logs)
	if _, err := os.Stat(f.socket); !os.IsNotExist(err) {
		t.Errorf("socket left after stop: %v", err)
	}
	if !strings.Contains(logs.String(), `"msg":"stopped"`) {
		t.Errorf("no stop in logs:\n%s", logs.String())
	}

	// After a restart TCP is served too.
	cmd, logs, _ = f.start(t, "--listen", "tcp://127.0.0.1:0")
	var tcpAddr string
	for _, line := range strings.Split(logs.String(), "\n") {
		var entry struct{ Msg, Network, Addr string }
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Msg == "listening" && entry.Network == "tcp" {
			tcpAddr = entry.Addr
		}
	}
	a, err := apiaddr.ParseAddr("tcp://" + tcpAddr)
	if err != nil {
		t.Fatalf("tcp address %q in logs: %v\n%s", tcpAddr, err, logs.String())
	}
	tconn, err := grpc.NewClient(a.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer tconn.Close()
	if _, err := framepackv1.NewDeviceServiceClient(tconn).ListDevices(t.Context(), &framepackv1.ListDevicesRequest{}); err != nil {
		t.Fatalf("devices over tcp: %v", err)
	}
	stop(t, cmd, logs)
}

func TestDaemonCommandLine(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown backend", f.args("--backend", "tpu"), 2, "--backend"},
		{"log format", f.args("--log-format", "xml"), 2, "--log-format"},
		{"log level", f.args("--log-level", "loud"), 2, "--log-level"},
		{"argument", f.args("extra"), 2, "unexpected arguments"},
		{"listen not tcp", f.args("--listen", "/tmp/x.sock"), 2, "--listen"},
		{"listen beyond loopback without tls", f.args("--listen", "tcp://0.0.0.0:0"), 1, "needs TLS"},
		{"http beyond loopback without tls", f.args("--http", "0.0.0.0:0"), 1, "needs TLS"},
		{"http bad address", f.args("--http", "8188"), 2, "--http"},
		{"no flag", []string{"--nope"}, 2, "flag provided but not defined"},
		{"backend without devices", f.args("--backend", "cuda"), 1, "probe cuda devices"},
		{"no probe worker", f.args("--workers-dir", f.dir), 1, "worker binary"},
		{"help", []string{"-h"}, 0, "usage: framepackd"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, f.bin, tc.args...)
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != tc.code || !strings.Contains(string(out), tc.want) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.code, tc.want, out)
			}
		})
	}
}

func TestSortLanes(t *testing.T) {
	lanes := []string{"cuda:10", "hip:0", "cpu", "cuda:2", "cuda:0"}
	sortLanes(lanes)
	if got := strings.Join(lanes, " "); got != "cpu cuda:0 cuda:2 cuda:10 hip:0" {
		t.Fatalf("sorted %s", got)
	}
}
