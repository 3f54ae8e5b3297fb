package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
)

func TestResolveLanes(t *testing.T) {
	found := map[string]*framepackv1.Device{
		"cuda:0": {Lane: "cuda:0", PciBusId: "00000000:3B:00.0"},
		"cuda:1": {Lane: "cuda:1", PciBusId: "0000:86:00.0"},
	}
	cpuOnly := map[string]*framepackv1.Device{"cpu": {Lane: "cpu"}}
	for _, tc := range []struct {
		name, spec string
		found      map[string]*framepackv1.Device
		want       string
		err        string
	}{
		{"auto gpus", "auto", found, "cuda:0,cuda:1", ""},
		{"empty is auto", "", found, "cuda:0,cuda:1", ""},
		{"auto cpu", "auto", cpuOnly, "cpu", ""},
		{"bus ids", "86:00.0, 0000:3b:00.0", found, "cuda:1,cuda:0", ""},
		{"cpu lanes", "cpu:0,cpu:1", cpuOnly, "cpu:0,cpu:1", ""},
		{"index", "cuda:1", found, "cuda:1", ""},
		{"twice", "cuda:1,0000:86:00.0", found, "", "named twice"},
		{"unknown bus", "0000:01:00.0", found, "", "no probed GPU at PCI address"},
		{"bad", "tpu:0", found, "", "is not a lane"},
		{"bad index", "cuda:x", found, "", "bad device index"},
		{"none", " , ", found, "", "names no lane"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveLanes(tc.spec, tc.found)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, %v; want error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || strings.Join(got, ",") != tc.want {
				t.Fatalf("got %v, %v; want %s", got, err, tc.want)
			}
		})
	}
}

// laneDaemon runs the daemon in this process (run, as main does) on the tiny test models with
// real worker processes, and returns a client connection once it serves.
func laneDaemon(t *testing.T, hook func(*guards), extra ...string) *grpc.ClientConn {
	t.Helper()
	root, err := parity.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bins := workertest.Build(t, "probe", "textenc", "vae", "clipvision", "transformer")
	dir, err := os.MkdirTemp("", "fpkl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	workers := filepath.Join(dir, "workers")
	if err := os.MkdirAll(workers, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, p := range bins {
		if err := os.Symlink(p, filepath.Join(workers, name)); err != nil {
			t.Fatal(err)
		}
	}
	socket := filepath.Join(dir, "d.sock")
	args := append([]string{"--state", filepath.Join(dir, "state"), "--socket", socket, "--workers-dir", workers,
		"--shm-root", filepath.Join(dir, "shm"), "--models", filepath.Join(root, "testdata", "parity", "models"),
		"--grace", "2s", "--log-level", "warn", "--no-previews"}, extra...)
	guardsHook = hook
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, func() {}, args, io.Discard) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
		guardsHook = nil
	})
	conn, err := grpc.NewClient(api.Addr{Network: "unix", Address: socket}.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hctx, hcancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer hcancel()
	resp, err := healthpb.NewHealthClient(conn).Check(hctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("daemon not serving: %v %v", resp, err)
	}
	return conn
}

// tinyJob submits a one-section job for the tiny test models.
func tinyJob(t *testing.T, c framepackv1.JobServiceClient, seed int64) string {
	t.Helper()
	root, err := parity.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	img, err := os.ReadFile(filepath.Join(root, "testdata", "demo", "start.png"))
	if err != nil {
		t.Fatal(err)
	}
	spec := &framepackv1.JobSpec{Prompt: "a girl dances", Seed: proto.Int64(seed), TotalSecondLength: 0.4, LatentWindowSize: 3, Steps: 2,
		Resolution: 96, UseTeacache: proto.Bool(false), ImageFilename: "start.png"}
	resp, err := c.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: img, Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetJob().GetId()
}

// span is when a job ran, from its own events: its first stage start to its terminal event.
type span struct {
	lane       string
	start, end time.Time
}

// watchSpan follows job id to its end and returns when and where it ran.
func watchSpan(t *testing.T, c framepackv1.JobServiceClient, id string, out chan<- span) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	stream, err := c.WatchJob(ctx, &framepackv1.WatchJobRequest{JobId: id})
	if err != nil {
		t.Error(err)
		out <- span{}
		return
	}
	var s span
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Errorf("watch %s: %v", id, err)
			break
		}
		if st := ev.GetStageStarted(); st != nil && s.start.IsZero() {
			s.start, s.lane = ev.GetTime().AsTime(), st.GetLane()
		}
		if f := ev.GetJobFailed(); f != nil {
			t.Errorf("job %s failed: %v", id, f.GetFailure().GetMessage())
		}
		if ev.GetJobFinished() != nil || ev.GetJobFailed() != nil || ev.GetJobCancelled() != nil {
			s.end = ev.GetTime().AsTime()
		}
	}
	out <- s
}

// runTwo submits two jobs and returns their spans, in submission order.
func runTwo(t *testing.T, conn *grpc.ClientConn) (a, b span) {
	t.Helper()
	c := framepackv1.NewJobServiceClient(conn)
	ca, cb := make(chan span, 1), make(chan span, 1)
	ida := tinyJob(t, c, 1)
	go watchSpan(t, c, ida, ca)
	idb := tinyJob(t, c, 2)
	go watchSpan(t, c, idb, cb)
	a, b = <-ca, <-cb
	if a.start.IsZero() || a.end.IsZero() || b.start.IsZero() || b.end.IsZero() {
		t.Fatalf("jobs did not run to the end: %+v %+v", a, b)
	}
	return a, b
}

// TestLanesParallel: two jobs on a daemon with two cpu lanes run at the same time, one per
// lane, with real worker processes; ListDevices shows both lanes.
func TestLanesParallel(t *testing.T) {
	conn := laneDaemon(t, nil, "--lanes", "cpu:0,cpu:1")
	devs, err := framepackv1.NewDeviceServiceClient(conn).ListDevices(t.Context(), &framepackv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(devs.GetDevices()) != 2 || devs.GetDevices()[0].GetLane() != "cpu:0" || devs.GetDevices()[1].GetLane() != "cpu:1" ||
		devs.GetDevices()[1].GetBackend() != "cpu" || devs.GetDevices()[1].GetTotalMemoryBytes() == 0 {
		t.Fatalf("devices %v", devs)
	}
	a, b := runTwo(t, conn)
	if a.lane == b.lane {
		t.Fatalf("both jobs ran on %s", a.lane)
	}
	// Each started before the other ended: they overlapped.
	if !a.start.Before(b.end) || !b.start.Before(a.end) {
		t.Fatalf("jobs did not overlap: a %s..%s on %s, b %s..%s on %s", a.start, a.end, a.lane, b.start, b.end, b.lane)
	}
	end, start := a.end, a.start
	if b.end.Before(end) {
		end = b.end
	}
	if b.start.After(start) {
		start = b.start
	}
	t.Logf("overlap %s (a ran %s, b %s)", end.Sub(start), a.end.Sub(a.start), b.end.Sub(b.start))
}

// TestLanesHeldSkipped: with cpu:0 held (as the watchdog holds a lane whose device memory did
// not come back), both jobs run on cpu:1, one after the other in submission order, and
// ListDevices shows the held lane and why.
func TestLanesHeldSkipped(t *testing.T) {
	conn := laneDaemon(t, func(g *guards) {
		g.lookup("cpu:0").Health().Hold("device memory not back (test)")
	}, "--lanes", "cpu:0,cpu:1")
	devs, err := framepackv1.NewDeviceServiceClient(conn).ListDevices(t.Context(), &framepackv1.ListDevicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if d := devs.GetDevices()[0]; d.GetLane() != "cpu:0" || d.GetLaneState() != framepackv1.LaneState_LANE_STATE_HELD ||
		!strings.Contains(d.GetLaneStateReason(), "not back") {
		t.Fatalf("held lane %v", d)
	}
	a, b := runTwo(t, conn)
	if a.lane != "cpu:1" || b.lane != "cpu:1" {
		t.Fatalf("jobs ran on %s and %s, want cpu:1 (cpu:0 is held)", a.lane, b.lane)
	}
	if b.start.Before(a.end) {
		t.Fatalf("FIFO on cpu:1 broken: b started %s before a ended %s", b.start, a.end)
	}
}

// TestDaemonLanesCommandLine: a --lanes the daemon cannot serve is a bad command line (exit 2)
// that says why.
func TestDaemonLanesCommandLine(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct{ lanes, want string }{
		{"tpu:0", "is not a lane"},
		{"0000:01:00.0", "no probed GPU at PCI address"},
		{"cpu:0,cpu:0", "named twice"},
	} {
		t.Run(tc.lanes, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, f.bin, f.args("--lanes", tc.lanes)...)
			out, _ := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); code != 2 || !strings.Contains(string(out), tc.want) {
				t.Fatalf("exit %d, want 2 with %q:\n%s", code, tc.want, out)
			}
		})
	}
}
