// Package httpapitest starts a real framepackd for HTTP tests: the job store, queue and gRPC
// server on a unix socket (supervisor/api), one cpu lane whose stages run in the real worker
// binaries on the tiny test models (testdata/parity/models, whose resolution, 96, is the
// default and the only bucket table they take), the metrics, and the HTTP API
// (supervisor/httpapi) on a loopback port, as cmd/framepackd assembles them. It is test code:
// only _test.go files import it, from a TestMain that runs workertest.Main.
package httpapitest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/httpapi"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/metrics"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// Options configure a test daemon's HTTP side.
type Options struct {
	// Page serves / (supervisor/web); nil leaves it out.
	Page http.Handler
	// Token is the bearer token the HTTP API requires; empty requires none.
	Token string
	// MaxUploadBytes bounds a submitted image; 0 is the default.
	MaxUploadBytes int64
	// Ready is the daemon's readiness (api.DaemonConfig.Ready); nil: always ready.
	Ready func() error
}

// Daemon is a running test daemon.
type Daemon struct {
	// URL is the HTTP API's base URL (http://127.0.0.1:PORT).
	URL string
	// Socket is the gRPC unix socket.
	Socket string
	// Daemon is the gRPC daemon.
	Daemon *api.Daemon
	// Jobs is a gRPC JobService client on the socket.
	Jobs framepackv1.JobServiceClient
	// Metrics are the daemon's metrics.
	Metrics *metrics.Metrics
	// Conn is the gRPC connection the HTTP API uses.
	Conn *grpc.ClientConn
}

// Start starts a daemon for tb and stops it when tb ends.
func Start(tb testing.TB, o Options) *Daemon {
	tb.Helper()
	root, err := parity.Root()
	if err != nil {
		tb.Fatal(err)
	}
	workers := workertest.Build(tb, lanes.TextEnc, lanes.VAE, lanes.ClipVision, lanes.Transformer)
	dir, err := os.MkdirTemp("", "fph")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	shmDir := shmtest.Dir()
	tb.Cleanup(func() { os.RemoveAll(shmDir) })
	shmRoot, err := shm.OpenRoot(shmDir)
	if err != nil {
		tb.Fatal(err)
	}
	log := logrus.New()
	log.SetLevel(logrus.WarnLevel)
	if os.Getenv("FRAMEPACK_TEST_LOG") != "" {
		log.SetLevel(logrus.DebugLevel)
	}
	models, err := pipeline.ResolveModels(filepath.Join(root, "models"))
	if err != nil {
		tb.Fatal(err)
	}
	info, err := pipeline.CheckModels(models) // the tiny models: 96 is their resolution
	if err != nil {
		tb.Fatal(err)
	}
	lane, err := lanes.New(lanes.Config{Name: "cpu", Backend: "cpu", Log: logrus.NewEntry(log),
		WorkerPath: func(m lanes.Model) (string, error) {
			if p, ok := workers[m]; ok {
				return p, nil
			}
			return "", fmt.Errorf("no %s worker", m)
		}})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = lane.Close() })

	socket := filepath.Join(dir, "d.sock")
	conn, err := grpc.NewClient(api.Addr{Network: "unix", Address: socket}.Target(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(api.MaxRecvMsgBytes), grpc.MaxCallRecvMsgSize(api.MaxRecvMsgBytes)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	devices := framepackv1.NewDeviceServiceClient(conn)
	var d *api.Daemon
	m := metrics.New(metrics.Config{Log: log,
		Jobs: func() (map[framepackv1.JobState]int, error) { return metrics.CountJobs(d.Store()) },
		Devices: func(ctx context.Context) (*framepackv1.ListDevicesResponse, error) {
			return devices.ListDevices(ctx, &framepackv1.ListDevicesRequest{})
		}})
	runner, err := pipeline.New(pipeline.Config{Models: models, Shm: shmRoot, Log: log,
		// Every section's MP4 stays, so tests can fetch section 0 after the job (the daemon's
		// default keeps only the newest: --keep-section-videos).
		KeepSectionVideos: true,
		Lane: func(name string) (*lanes.Lane, error) {
			if name != "cpu" {
				return nil, fmt.Errorf("no lane %q", name)
			}
			return lane, nil
		},
		OnStage: func(rec pipeline.StageRecord) {
			r := metrics.StageRecord{Lane: rec.Lane, Worker: rec.Worker, Reused: rec.Reused, Kept: rec.Kept, Err: rec.Err}
			for _, t := range rec.ConvTiers {
				r.ConvTiers = append(r.ConvTiers, metrics.ConvTier{Tier: metrics.TierName(framepackv1.ConvTier(t.Tier)),
					Attempts: t.Attempts, Successes: t.Successes, Failures: t.Failures, SkippedAsHung: t.SkippedAsHung, Time: t.Time})
			}
			m.ObserveStage(r)
		}})
	if err != nil {
		tb.Fatal(err)
	}
	d, err = api.StartDaemon(api.DaemonConfig{StateDir: filepath.Join(dir, "state"), Listen: []api.Addr{{Network: "unix", Address: socket}},
		Lanes: []string{"cpu"}, Run: runner.Run, Grace: time.Second, Log: log, OnEvent: m.Observe,
		Ready: o.Ready, Models: func() api.ModelFit { return info }})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := d.Stop(ctx); err != nil {
			tb.Errorf("stop daemon: %v", err)
		}
	})
	h, err := httpapi.New(httpapi.Config{Conn: conn, JobDir: func(id string) string { return d.Store().JobDir(id).Path() },
		Metrics: m.Handler(), Page: o.Page, Token: o.Token, MaxUploadBytes: o.MaxUploadBytes, Log: log})
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return &Daemon{URL: srv.URL, Socket: socket, Daemon: d, Jobs: framepackv1.NewJobServiceClient(conn), Metrics: m, Conn: conn}
}

// TinySpec is a job the tiny models run in seconds: seconds of video at window 3 (two
// sections for 1 s), steps sampling steps, the 96 px bucket table, TeaCache off.
func TinySpec(seconds float32, steps uint32) *framepackv1.JobSpec {
	off := false
	return &framepackv1.JobSpec{Prompt: "The girl dances gracefully, with clear movements, full of charm.", TotalSecondLength: seconds,
		LatentWindowSize: 3, Steps: steps, Resolution: 96, UseTeacache: &off, Seed: proto.Int64(31337)}
}

// DemoImage returns testdata/demo/start.png's path.
func DemoImage() (string, error) {
	m, err := parity.ModuleRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(m, "testdata", "demo", "start.png")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("demo image: %w", err)
	}
	return p, nil
}
