package watchdog_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/faults"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/testbin"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline"
	"github.com/framepackd/framepackd/supervisor/video"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// daemonEnv turns the test binary into a framepackd process (one a test kills); its value is
// the JSON of daemonOpts.
const daemonEnv = "FRAMEPACK_WATCHDOG_TEST_DAEMON"

// daemonOpts configure a test daemon: framepackd's pieces as cmd/framepackd puts them together
// (lane, watchdog, pipeline, API on a unix socket), with the fake device ledger as the lane's
// device memory and the tests' short op deadline.
type daemonOpts struct {
	State   string                 `json:"state"`
	Socket  string                 `json:"socket"`
	Shm     string                 `json:"shm"`
	Models  string                 `json:"models"`
	Ledger  string                 `json:"ledger"`
	Cache   string                 `json:"cache"`
	Workers map[lanes.Model]string `json:"workers"`
	// OpDeadline is the watchdog's op deadline; 0 means testOp.
	OpDeadline time.Duration `json:"op_deadline"`
	// HangDecodeSection, when ≥ 0, makes the first attempt of that section's VAE decode hang
	// in its first convolution (the fault a daemon process carries; a test kills it there).
	HangDecodeSection int `json:"hang_decode_section"`

	plan   func(watchdog.AttemptInfo) *workerkit.Fault // in-process daemons only
	config func(*watchdog.Config)
}

func newDaemonOpts(t testing.TB) daemonOpts {
	t.Helper()
	dir, err := os.MkdirTemp("", "fpwd")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	shmDir := shmtest.Dir()
	t.Cleanup(func() { os.RemoveAll(shmDir) })
	return daemonOpts{State: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "d.sock"), Shm: shmDir,
		Models: modelsDir(t), Ledger: filepath.Join(dir, "vram"), Cache: filepath.Join(dir, "cache", "conv.json"),
		Workers: workerBins(t), HangDecodeSection: -1}
}

// testDaemon is a running daemon with its lane and watchdog.
type testDaemon struct {
	d    *api.Daemon
	wd   *watchdog.Watchdog
	lane *lanes.Lane
}

// stop stops the daemon gracefully and closes the lane and the watchdog.
func (d *testDaemon) stop() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := d.d.Stop(ctx)
	d.lane.Close()
	d.wd.Close()
	return err
}

func startDaemon(o daemonOpts, log *logrus.Logger) (*testDaemon, error) {
	models, err := pipeline.ResolveModels(o.Models)
	if err != nil {
		return nil, err
	}
	root, err := shm.OpenRoot(o.Shm)
	if err != nil {
		return nil, err
	}
	if _, err := root.RemoveStale(); err != nil {
		return nil, err
	}
	ledger, err := faults.NewLedger(o.Ledger)
	if err != nil {
		return nil, err
	}
	cache, err := convcache.Open(o.Cache)
	if err != nil {
		return nil, err
	}
	socketDir, err := os.MkdirTemp("", "fpws")
	if err != nil {
		return nil, err
	}
	lane, err := lanes.New(lanes.Config{Name: "cpu", Backend: "cpu", Log: logrus.NewEntry(log), SocketDir: socketDir,
		Env: []string{faults.EnvFakeVRAMDir + "=" + ledger.Dir()},
		WorkerPath: func(m lanes.Model) (string, error) {
			if p, ok := o.Workers[m]; ok {
				return p, nil
			}
			return "", fmt.Errorf("no %s worker", m)
		}})
	if err != nil {
		return nil, err
	}
	dl := testDeadlines()
	if o.OpDeadline > 0 {
		dl.OpMin = o.OpDeadline
	}
	plan := o.plan
	if o.HangDecodeSection >= 0 {
		plan = func(a watchdog.AttemptInfo) *workerkit.Fault {
			if a.Stage.Kind == framepackv1.Stage_STAGE_VAE_DECODE && int(a.Stage.Section) == o.HangDecodeSection && a.Attempt == 1 {
				return &workerkit.Fault{HangConvTier: workerkit.ConvTierVendorTuned}
			}
			return nil
		}
	}
	cfg := watchdog.Config{Lane: "cpu", LaneBackend: "cpu", Deadlines: dl, ConvCache: cache,
		Recovery: &watchdog.Recovery{Memory: watchdog.FakeVRAM{L: ledger}},
		Probe: watchdog.ProbeWorker(workerkit.Config{Path: o.Workers["probe"], SocketDir: socketDir, Log: logrus.NewEntry(log)},
			"cpu", 0, watchdog.DefaultProbeAllocate),
		ProbeTimeout: 20 * time.Second, FaultPlan: plan, Log: logrus.NewEntry(log)}
	if o.config != nil {
		o.config(&cfg)
	}
	wd, err := watchdog.New(cfg)
	if err != nil {
		return nil, err
	}
	runner, err := pipeline.New(pipeline.Config{Models: models, Shm: root, Log: log, KeepSectionHistory: true, NoPreviews: true,
		Lane: func(name string) (*lanes.Lane, error) {
			if name != "cpu" {
				return nil, fmt.Errorf("no lane %q", name)
			}
			return lane, nil
		},
		Watchdog: func(string) *watchdog.Watchdog { return wd }})
	if err != nil {
		return nil, err
	}
	d, err := api.StartDaemon(api.DaemonConfig{StateDir: o.State, Listen: []api.Addr{{Network: "unix", Address: o.Socket}},
		Lanes: []string{"cpu"}, Run: runner.Run, Grace: 2 * time.Second, Log: log,
		Devices: func(context.Context) ([]*framepackv1.Device, error) {
			dev := &framepackv1.Device{Lane: "cpu", Backend: "cpu", Name: "cpu"}
			wd.Health().Annotate(dev)
			return []*framepackv1.Device{dev}, nil
		}})
	if err != nil {
		return nil, err
	}
	return &testDaemon{d: d, wd: wd, lane: lane}, nil
}

// daemonMain is the test binary as a daemon process: it serves until killed or SIGTERM.
func daemonMain(raw string) int {
	return testbin.Serve(func() (func() error, error) {
		var o daemonOpts
		if err := json.Unmarshal([]byte(raw), &o); err != nil {
			return nil, fmt.Errorf("daemon options: %w", err)
		}
		d, err := startDaemon(o, quietLog())
		if err != nil {
			return nil, err
		}
		return d.stop, nil
	})
}

// startDaemonProcess runs the test binary as a daemon and waits until it serves.
func startDaemonProcess(t *testing.T, o daemonOpts) *exec.Cmd {
	t.Helper()
	raw, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return testbin.Reexec(t, daemonEnv, string(raw), 60*time.Second)
}

// conn is a client connection to a daemon's socket.
func conn(t testing.TB, socket string) *grpc.ClientConn {
	t.Helper()
	c, err := grpc.NewClient(api.Addr{Network: "unix", Address: socket}.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// watch streams job id's events to fn until the terminal event (returned) or fn says stop.
func watch(ctx context.Context, c framepackv1.JobServiceClient, id string, fn func(*framepackv1.JobEvent) bool) (*framepackv1.JobEvent, error) {
	stream, err := c.WatchJob(ctx, &framepackv1.WatchJobRequest{JobId: id})
	if err != nil {
		return nil, err
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return nil, err
		}
		if fn != nil && !fn(ev) {
			return ev, nil
		}
		if ev.GetJobFinished() != nil || ev.GetJobFailed() != nil || ev.GetJobCancelled() != nil {
			return ev, nil
		}
	}
}

// demoImage is a 40×56 RGB gradient as PNG.
func demoImage(t testing.TB) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, 56, 40))
	for y := range 40 {
		for x := range 56 {
			i := img.PixOffset(x, y)
			img.Pix[i], img.Pix[i+1], img.Pix[i+2], img.Pix[i+3] = uint8(4*x), uint8(6*y), uint8(2*(x+y)), 255
		}
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// demoSpec is a tiny two-section job: 32×32 frames, 3 steps, window 3.
func demoSpec(seed int64) *framepackv1.JobSpec {
	return &framepackv1.JobSpec{Prompt: "a cat walks on the grass", Seed: proto.Int64(seed), TotalSecondLength: 0.8, LatentWindowSize: 3,
		Steps: 3, Cfg: 1, Gs: 10, Rs: 0, Resolution: 32, UseTeacache: proto.Bool(false), ImageFilename: "start.png",
		Buckets: []*framepackv1.Bucket{{Height: 32, Width: 32}}}
}

// finalPixels is a finished job's output: the history latents of its last section file (the
// retained ones, f32) followed by the frames of its video, each byte a value: two runs that
// computed the same pixels wrote the same frames.
func finalPixels(t testing.TB, state, id string, sections int) []float32 {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(state, "jobs", id, "history", pipeline.SectionFile(sections-1)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, _, err := f.Float32("history_latents")
	if err != nil {
		t.Fatal(err)
	}
	videos := filepath.Join(state, "jobs", id, "video")
	path := filepath.Join(videos, fmt.Sprintf("section-%03d.mp4", sections-1))
	if _, err := os.Stat(path); err != nil {
		path = video.FramesDir(path)
	}
	frames, err := (&video.Writer{}).ReadFrames(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range frames {
		v = append(v, float32(b))
	}
	return v
}

// waitGone waits up to d for pid to be gone (or a zombie); it returns how long it took.
func waitGone(pid int, d time.Duration) (time.Duration, bool) {
	start := time.Now()
	for {
		st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || bytes.Contains(st, []byte(") Z ")) {
			return time.Since(start), true
		}
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// shmEmpty reports what is left in a shared-memory root.
func shmEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return fmt.Errorf("shared memory left in %s: %v", dir, names)
	}
	return nil
}

// openFDs lists this process's open file descriptors with their targets.
func openFDs() map[string]string {
	out := map[string]string{}
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		target, _ := os.Readlink("/proc/self/fd/" + e.Name())
		out[e.Name()] = target
	}
	return out
}

// TestFaultSupervisorKilled: the supervisor is SIGKILLed while a worker is stuck in its stage;
// the worker is gone within 2 s (parent-death signal), and a restarted supervisor takes the
// job up after its last checkpointed section and ends with the same frames as a run without
// faults.
func TestFaultSupervisorKilled(t *testing.T) {
	spec := demoSpec(7)
	img := demoImage(t)

	ref := newDaemonOpts(t)
	rd, err := startDaemon(ref, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	rc := conn(t, ref.Socket)
	refID := submit(t, framepackv1.NewJobServiceClient(rc), spec, img)
	if ev := waitJob(t, framepackv1.NewJobServiceClient(rc), refID); ev.GetJobFinished() == nil {
		t.Fatalf("reference job: %v", ev)
	}
	rc.Close()
	if err := rd.stop(); err != nil {
		t.Fatal(err)
	}
	want := finalPixels(t, ref.State, refID, 2)

	o := newDaemonOpts(t)
	o.HangDecodeSection = 1
	o.OpDeadline = 5 * time.Minute // the watchdog must not end the hang: the test kills the supervisor there
	proc := startDaemonProcess(t, o)
	c := conn(t, o.Socket)
	defer c.Close()
	jc := framepackv1.NewJobServiceClient(c)
	id := submit(t, jc, spec, img)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	if _, err := watch(ctx, jc, id, func(ev *framepackv1.JobEvent) bool {
		s := ev.GetStageStarted()
		return s == nil || s.GetStage() != framepackv1.Stage_STAGE_VAE_DECODE || s.GetSectionIndex() != 1
	}); err != nil {
		t.Fatal(err)
	}
	// The decode worker is the daemon's child; wait until it is stuck in its conv.
	var worker int
	deadline := time.Now().Add(time.Minute)
	for worker == 0 {
		for _, k := range children(proc.Process.Pid) {
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", k)); strings.TrimSuffix(exe, " (deleted)") == o.Workers[lanes.VAE] {
				worker = k
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no vae worker under the daemon")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The signal that the worker is inside its hang: its beacon (read as the watchdog reads it,
	// through the daemon's page) shows the injected conv in flight.
	waitConvInFlight(t, proc.Process.Pid, worker, time.Minute)
	if _, gone := waitGone(worker, 0); gone {
		t.Fatalf("worker %d ended before the supervisor was killed", worker)
	}
	if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took, gone := waitGone(worker, 2*time.Second)
	if !gone {
		t.Fatalf("worker %d still alive %v after the supervisor was killed", worker, took)
	}
	t.Logf("worker %d (stuck in its stage) gone %v after the supervisor's SIGKILL", worker, took.Round(time.Microsecond))
	proc.Wait()
	c.Close()

	o.HangDecodeSection = -1
	o.OpDeadline = 0
	d2, err := startDaemon(o, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	c2 := conn(t, o.Socket)
	jc2 := framepackv1.NewJobServiceClient(c2)
	ctx2, cancel2 := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel2()
	textEncodes, transformer1 := 0, 0 // the watch replays the killed run's events first
	last, err := watch(ctx2, jc2, id, func(ev *framepackv1.JobEvent) bool {
		if s := ev.GetStageStarted(); s != nil {
			switch {
			case s.GetStage() == framepackv1.Stage_STAGE_TEXT_ENCODE:
				textEncodes++
			case s.GetStage() == framepackv1.Stage_STAGE_TRANSFORMER && s.GetSectionIndex() == 1:
				transformer1++
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if last.GetJobFinished() == nil {
		t.Fatalf("resumed job ended with %v", last)
	}
	c2.Close()
	if err := d2.stop(); err != nil {
		t.Fatal(err)
	}
	if textEncodes != 1 || transformer1 != 2 {
		t.Errorf("text encodes %d, section 1 samplings %d: want the restarted supervisor to resume at section 1", textEncodes, transformer1)
	}
	if !equal(finalPixels(t, o.State, id, 2), want) {
		t.Fatal("the resumed job's frames differ from the run without faults")
	}
	if left := workertest.Processes(o.Workers); len(left) > 0 {
		t.Fatalf("worker processes left: %v", left)
	}
	if err := shmEmpty(o.Shm); err != nil {
		t.Fatal(err)
	}
}

// submit submits a job and returns its id.
func submit(t testing.TB, c framepackv1.JobServiceClient, spec *framepackv1.JobSpec, img []byte) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	resp, err := c.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: img, Spec: spec})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	return resp.GetJob().GetId()
}

// waitJob watches a job to its terminal event.
func waitJob(t testing.TB, c framepackv1.JobServiceClient, id string) *framepackv1.JobEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	ev, err := watch(ctx, c, id, nil)
	if err != nil {
		t.Fatalf("watch %s: %v", id, err)
	}
	return ev
}

// waitConvInFlight waits until the beacon of worker pid, one of the pages daemon holds, shows
// a conv3d in flight (the injected hang).
func waitConvInFlight(t *testing.T, daemon, pid int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ents, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", daemon))
		for _, e := range ents {
			fd := fmt.Sprintf("/proc/%d/fd/%s", daemon, e.Name())
			if target, _ := os.Readlink(fd); !strings.Contains(target, "framepackd-beacon") {
				continue
			}
			page, err := beacon.OpenPage(fd)
			if err != nil {
				continue
			}
			s, err := page.Snapshot()
			page.Close()
			if err == nil && s.PID == pid && s.InOp && s.Op == "conv3d" {
				t.Logf("worker %d in %s (shape %s, tier %s)", pid, s.Op, s.ConvKey, s.ConvTier)
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker %d: its beacon never showed the conv in flight", pid)
		}
		time.Sleep(5 * time.Millisecond) // the beacon is polled, as the watchdog polls it
	}
}
