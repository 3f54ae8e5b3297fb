package pipeline_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/testbin"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline"
	"github.com/framepackd/framepackd/supervisor/video"
)

// daemonEnv turns the test binary into a framepackd process (the supervisor a test kills):
// its value is the JSON of daemonOpts.
const daemonEnv = "FRAMEPACK_PIPELINE_TEST_DAEMON"

func TestMain(m *testing.M) {
	if v := os.Getenv(daemonEnv); v != "" {
		os.Exit(daemonMain(v))
	}
	os.Exit(workertest.Main(m))
}

// daemonOpts configures a test daemon.
type daemonOpts struct {
	State       string                 `json:"state"`
	Socket      string                 `json:"socket"`
	Shm         string                 `json:"shm"`
	Models      string                 `json:"models"`
	Workers     map[lanes.Model]string `json:"workers"`
	KeepHistory bool                   `json:"keep_history"`
	Residency   bool                   `json:"residency"`
	NoPreviews  bool                   `json:"no_previews"`
	// NoFFmpeg runs the daemon as on a machine without ffmpeg: videos are PNG frame folders.
	NoFFmpeg bool `json:"no_ffmpeg"`
	// DeviceMemory is the lane's device memory (lanes.Config.DeviceMemory); 0: no worker cap.
	DeviceMemory uint64 `json:"device_memory"`
	// KeepAlive is the runner's keep-alive for jobs without their own (pipeline.Config), and
	// LaneKeepAlive the lane's for KeepAliveAuto (lanes.Config).
	KeepAlive     time.Duration `json:"keep_alive"`
	LaneKeepAlive time.Duration `json:"lane_keep_alive"`

	onStage func(pipeline.StageRecord)
}

// buildWorkers builds the four worker binaries once per test process.
func buildWorkers(t testing.TB) map[lanes.Model]string {
	t.Helper()
	return workertest.Build(t, lanes.TextEnc, lanes.VAE, lanes.ClipVision, lanes.Transformer)
}

// shortDir is a temporary directory with a short path (unix socket paths are limited).
func shortDir(t testing.TB) string {
	t.Helper()
	d, err := os.MkdirTemp("", "fpp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

// newOpts returns the options of a test daemon on fresh directories, with a private
// shared-memory root removed when the test ends.
func newOpts(t testing.TB, workers map[lanes.Model]string) daemonOpts {
	t.Helper()
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	dir := shortDir(t)
	shmDir := shmtest.Dir()
	t.Cleanup(func() { os.RemoveAll(shmDir) })
	return daemonOpts{State: filepath.Join(dir, "state"), Socket: filepath.Join(dir, "d.sock"), Shm: shmDir,
		Models: filepath.Join(root, "models"), Workers: workers, KeepHistory: true}
}

// testLane is the test daemon's one lane, named as cmd/framepackd names lanes: "cpu", or device
// 0 of workertest.Backend() ("cuda:0" when FRAMEPACK_BACKEND=cuda, as scripts/gpu-check.sh
// runs TestParityPipeline), its workers loading on that backend.
func testLane() (name, backend string) {
	backend = workertest.Backend()
	if backend == "cpu" {
		return "cpu", backend
	}
	return backend + ":0", backend
}

// newDaemon starts framepackd's pieces as cmd/framepackd assembles them: the lane, the
// pipeline Runner, the API daemon on a unix socket.
func newDaemon(o daemonOpts, log *logrus.Logger) (*api.Daemon, error) {
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
	laneName, backend := testLane()
	lane, err := lanes.New(lanes.Config{Name: laneName, Backend: backend, Log: logrus.NewEntry(log),
		Residency: o.Residency, DeviceMemory: o.DeviceMemory, KeepAlive: o.LaneKeepAlive,
		WorkerPath: func(m lanes.Model) (string, error) {
			if p, ok := o.Workers[m]; ok {
				return p, nil
			}
			return "", fmt.Errorf("no %s worker", m)
		}})
	if err != nil {
		return nil, err
	}
	var vw *video.Writer
	if o.NoFFmpeg {
		vw = &video.Writer{LookPath: func(string) (string, error) { return "", exec.ErrNotFound }}
	}
	runner, err := pipeline.New(pipeline.Config{Models: models, Shm: root, Log: log, Video: vw,
		Lane: func(name string) (*lanes.Lane, error) {
			if name != laneName {
				return nil, fmt.Errorf("no lane %q", name)
			}
			return lane, nil
		},
		KeepSectionHistory: o.KeepHistory, Residency: o.Residency, KeepAlive: o.KeepAlive, NoPreviews: o.NoPreviews, OnStage: o.onStage})
	if err != nil {
		return nil, err
	}
	return api.StartDaemon(api.DaemonConfig{StateDir: o.State, Listen: []api.Addr{{Network: "unix", Address: o.Socket}},
		Lanes: []string{laneName}, Run: runner.Run, CheckVariant: runner.CheckVariant, Grace: time.Second, Log: log})
}

func testLogger() *logrus.Logger {
	l := logrus.New()
	l.SetLevel(logrus.WarnLevel)
	if os.Getenv("FRAMEPACK_TEST_LOG") != "" {
		l.SetLevel(logrus.DebugLevel)
	}
	return l
}

// daemonMain is the test binary as a daemon process: it serves until killed or SIGTERM.
func daemonMain(raw string) int {
	return testbin.Serve(func() (func() error, error) {
		var o daemonOpts
		if err := json.Unmarshal([]byte(raw), &o); err != nil {
			return nil, fmt.Errorf("daemon options: %w", err)
		}
		log := testLogger()
		log.SetOutput(os.Stderr)
		d, err := newDaemon(o, log)
		if err != nil {
			return nil, err
		}
		return func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			return d.Stop(ctx)
		}, nil
	})
}

// startDaemonProcess runs the test binary as a daemon and waits until it serves.
func startDaemonProcess(t *testing.T, o daemonOpts) *exec.Cmd {
	t.Helper()
	raw, err := json.Marshal(o)
	if err != nil {
		t.Fatal(err)
	}
	return testbin.Reexec(t, daemonEnv, string(raw), 30*time.Second)
}

// client is a JobService client on a daemon's socket.
func client(t testing.TB, socket string) framepackv1.JobServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(api.Addr{Network: "unix", Address: socket}.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return framepackv1.NewJobServiceClient(conn)
}

// watch streams job id's events to fn until the terminal event (returned) or fn says stop.
func watch(ctx context.Context, c framepackv1.JobServiceClient, id string, fn func(*framepackv1.JobEvent) bool) (*framepackv1.JobEvent, error) {
	stream, err := c.WatchJob(ctx, &framepackv1.WatchJobRequest{JobId: id, IncludePreviews: true})
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

// pngOf encodes an HWC uint8 RGB image as PNG (lossless, so the job sees the fixture's pixels).
func pngOf(t testing.TB, pix []int64, h, w int) []byte {
	t.Helper()
	img := image.NewNRGBA(image.Rect(0, 0, w, h))
	for i := 0; i < h*w; i++ {
		img.Pix[4*i], img.Pix[4*i+1], img.Pix[4*i+2], img.Pix[4*i+3] = uint8(pix[3*i]), uint8(pix[3*i+1]), uint8(pix[3*i+2]), 255
	}
	var b bytes.Buffer
	if err := png.Encode(&b, img); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// waitNoWorkers waits up to d for every worker process to be gone.
func waitNoWorkers(workers map[lanes.Model]string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		left := workertest.Processes(workers)
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("worker processes still alive: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// shmEmpty reports what is left in a shared-memory root (nothing after a job).
func shmEmpty(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) > 0 {
		return fmt.Errorf("shared memory left in %s: %v", dir, names)
	}
	return nil
}
