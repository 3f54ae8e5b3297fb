// Command framepackd is the FramePack supervisor daemon: it serves the framepack.v1 gRPC API
// on a unix socket (and optionally TCP), keeps the job queue and store in its state directory,
// and runs jobs one at a time per device lane through the model workers.
//
// Usage:
//
//	framepackd [--models DIR] [--state DIR] [--socket PATH] [--listen tcp://HOST:PORT]
//	           [--backend auto|cpu|cuda|hip] [--workers-dir DIR] [--lanes LANE,…]
//	           [--grace 30s] [--log-level info] [--log-format text|json] [--shm-root DIR]
//	           [--residency=false] [--keep-alive auto|DURATION] [--lane-memory-gb N|LANE=N,…]
//	           [--cpu-device-memory-gb N] [--no-previews]
//	           [--keep-section-history] [--siglip-processor torchvision|pil]
//	           [--pull-missing [--pull-variants i2v,f1]]
//
// --models is a folder holding the three models in one of these layouts (pipeline.ResolveModels):
// the tiny test models' (hunyuanvideo/, flux_redux_bfl/, framepack_i2v/, as in
// testdata/parity/models), one folder per Hugging Face repository
// (hunyuanvideo-community/HunyuanVideo, lllyasviel/flux_redux_bfl, lllyasviel/FramePackI2V_HY),
// or a Hugging Face cache (models--<org>--<name>/snapshots/…, also under hub/, e.g. FramePack's
// hf_download/). --pull-missing downloads what is missing from the Hugging Face hub into
// --models before serving (pull.go).
//
// Defaults: the socket is $XDG_RUNTIME_DIR/framepackd.sock, else /run/user/<uid>/framepackd.sock
// when that directory is this user's, else ~/.local/state/framepackd/framepackd.sock; the
// state directory is $XDG_STATE_HOME/framepackd or ~/.local/state/framepackd; the worker
// binaries are looked up next to this executable.
//
// At start the daemon removes the shared-memory directories of dead supervisors
// (/dev/shm/framepackd-<uid>/…), probes the devices in a throwaway probe worker to name its
// lanes (cpu, cuda:N, hip:N), and takes up the jobs it had queued or running (running ones
// resume after their last finished section).
//
// A job's workers share one budget on their lane: the lane's device memory (a GPU's total; on
// a cpu lane the host's RAM, or --cpu-device-memory-gb) less the job's
// gpu_memory_preservation_gb and a 1 GiB reserve, at most --lane-memory-gb. Each worker runs
// under a cap of its own from that budget, sized by its model's estimate for the job; workers
// whose caps fit the budget together stay alive between stages and, for --keep-alive, between
// jobs (supervisor/lanes).
//
// SIGINT or SIGTERM stops it gracefully: no new job starts, a running job gets the grace
// period (--grace) to reach a stage boundary and is then cancelled — it stays queued and
// resumes at the next start — watch streams end, and the daemon exits 0. A second signal kills
// it at once (jobs still resume at the next start).
//
// Exit status: 0 after a clean stop, 1 when it cannot start or fails while running, 2 for a
// bad command line.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/framepackd/framepackd/internal/apiaddr"
	"github.com/framepackd/framepackd/internal/buildinfo"
	"github.com/framepackd/framepackd/internal/envconfig"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/devices"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/video"
	"github.com/framepackd/framepackd/supervisor/web"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
)

// options are the command-line flags.
type options struct {
	models     string
	state      string
	socket     string
	listen     string
	backend    string
	workersDir string
	lanes      string
	grace      time.Duration
	logLevel   string
	logFormat  string
	shmRoot    string
	shm        *shm.Instance    // this daemon's own shared-memory folder, opened by run
	pipeline   *pipelineOptions // the pipeline's flags (pipeline.go)
	limits     *limitOptions    // disk and input limits (limits.go)
	pull       *pullOptions     // --pull-missing (pull.go)
	minJobGB   float64
	// allowMismatch keeps lanes whose GPU runtime the host driver cannot serve (runtime.go).
	allowMismatch bool
	http          *httpOptions    // the HTTP listener's flags (http.go)
	ops           *opsOptions     // watchdog deadlines, retries, recovery wait (ops.go)
	cluster       *clusterOptions // --cluster: daemons sharing one queue (cluster.go)
}

// errUsage marks a bad command line (exit status 2).
var errUsage = errors.New("usage")

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, stop, os.Args[1:], os.Stderr)
	stop()
	switch {
	case errors.Is(err, flag.ErrHelp):
		os.Exit(0)
	case errors.Is(err, errUsage):
		os.Exit(2)
	case err != nil:
		fmt.Fprintf(os.Stderr, "framepackd: %v\n", err)
		os.Exit(1)
	}
}

func defaultModels() string {
	if d := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(d) {
		return filepath.Join(d, "framepackd", "models")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "models"
	}
	return filepath.Join(home, ".local", "share", "framepackd", "models")
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("framepackd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.models, "models", defaultModels(), "directory of the model weights")
	fs.StringVar(&o.state, "state", apiaddr.DefaultStateHome(), "state directory (job store, job files)")
	fs.StringVar(&o.socket, "socket", apiaddr.DefaultSocketPath(), "unix socket to serve on (mode 0600)")
	fs.StringVar(&o.listen, "listen", "", "also serve gRPC on TCP, tcp://HOST:PORT; beyond loopback it needs --tls-cert, --tls-key and --token-file")
	fs.StringVar(&o.backend, "backend", "auto", "compute backend: auto, cpu, cuda or hip")
	fs.StringVar(&o.workersDir, "workers-dir", "", "directory of the worker binaries (default: next to this executable)")
	fs.StringVar(&o.lanes, "lanes", "auto", "comma-separated lanes to run jobs on: auto (one per probed GPU, else the cpu), cpu, cpu:N, cuda:N, hip:N, or a GPU's PCI bus id")
	fs.BoolVar(&o.allowMismatch, "allow-runtime-mismatch", false, "run lanes whose GPU runtime (the container's CUDA/ROCm) the host driver cannot serve, instead of holding them")
	fs.Float64Var(&o.minJobGB, "job-min-memory-gb", 0, "free device memory a job needs on a GPU lane besides its gpu_memory_preservation_gb")
	fs.DurationVar(&o.grace, "grace", api.DefaultGrace, "on stop, how long a running job may take to reach a stage boundary before it is cancelled")
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&o.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&o.shmRoot, "shm-root", shm.DefaultRoot(), "shared-memory root for tensors passed between processes")
	o.pipeline = addPipelineFlags(fs)
	o.limits = addLimitFlags(fs)
	o.pull = addPullFlags(fs)
	o.http = addHTTPFlags(fs)
	o.ops = addOpsFlags(fs)
	o.cluster = addClusterFlags(fs)
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: framepackd [flags]")
		fs.PrintDefaults()
		envconfig.Usage(fs.Output(), envconfig.Daemon, envconfig.Native, envconfig.Test)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	if *showVersion {
		fmt.Fprintln(os.Stdout, buildinfo.String("framepackd"))
		return nil, flag.ErrHelp // exit 0 without starting
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "framepackd: unexpected arguments %q\n", fs.Args())
		return nil, errUsage
	}
	switch o.backend {
	case "auto", "cpu", "cuda", "hip":
	default:
		fmt.Fprintf(stderr, "framepackd: --backend %q: want auto, cpu, cuda or hip\n", o.backend)
		return nil, errUsage
	}
	switch o.logFormat {
	case "text", "json":
	default:
		fmt.Fprintf(stderr, "framepackd: --log-format %q: want text or json\n", o.logFormat)
		return nil, errUsage
	}
	if err := o.cluster.check(); err != nil {
		fmt.Fprintln(stderr, "framepackd:", err)
		return nil, errUsage
	}
	if err := o.ops.check(); err != nil {
		fmt.Fprintln(stderr, "framepackd:", err)
		return nil, errUsage
	}
	if o.grace < 0 {
		fmt.Fprintln(stderr, "framepackd: --grace must not be negative")
		return nil, errUsage
	}
	return o, nil
}

func newLogger(o *options, out io.Writer) (*logrus.Logger, error) {
	log := logrus.New()
	log.SetOutput(out)
	lvl, err := logrus.ParseLevel(o.logLevel)
	if err != nil {
		return nil, fmt.Errorf("%w: --log-level: %v", errUsage, err)
	}
	log.SetLevel(lvl)
	if o.logFormat == "json" {
		log.SetFormatter(&logrus.JSONFormatter{})
	} else {
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	}
	return log, nil
}

// run is the daemon; stopSignals stops catching SIGINT/SIGTERM (a second one then kills).
func run(ctx context.Context, stopSignals func(), args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "framepackd:", err)
		return err
	}
	if o.workersDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("find workers: %w", err)
		}
		o.workersDir = filepath.Dir(exe)
	}
	listen := []api.Addr{{Network: "unix", Address: o.socket}}
	var tcpGRPC []net.Listener
	var grpcAuth []grpc.ServerOption
	if o.listen != "" {
		a, err := apiaddr.ParseAddr(o.listen)
		if err != nil || a.Network != "tcp" {
			fmt.Fprintf(stderr, "framepackd: --listen %q: want tcp://HOST:PORT\n", o.listen)
			return errUsage
		}
		if tcpGRPC, grpcAuth, err = listenGRPC(a, o.http); err != nil { // TLS and token (http.go)
			return err
		}
	}
	log.WithFields(logrus.Fields{"state": o.state, "models": o.models, "workers": o.workersDir, "backend": o.backend}).Info("framepackd starting")

	inst, err := openShm(o.shmRoot, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := inst.Close(); err != nil {
			log.WithError(err).Warn("remove shared-memory folder")
		}
	}()
	o.shm = inst
	if err := pullMissing(ctx, o, log); err != nil {
		return err
	}
	tmp, err := openTemp(log) // tempfiles.go; points TMPDIR at the daemon's own folder until Close
	if err != nil {
		return fmt.Errorf("temporary folder: %w", err)
	}
	defer func() {
		if err := tmp.Close(); err != nil {
			log.WithError(err).Warn("remove temporary folder")
		}
	}()
	if b := int64(o.limits.maxVideoBytes); b <= 0 || b > api.MaxRequestBytes {
		fmt.Fprintf(stderr, "framepackd: --max-video-bytes %d: want 1 to %d (%d MiB)\n", b, api.MaxRequestBytes, api.MaxRequestBytes>>20)
		return errUsage
	}
	if st, err := os.Stat(o.models); err != nil || !st.IsDir() {
		log.WithField("models", o.models).Warn("models directory not found; jobs will fail until it exists")
	}
	if _, err := (&video.Writer{}).Available(); err != nil {
		log.WithError(err).Warn("ffmpeg not found: videos will be kept as PNG frames (make setup installs ffmpeg)")
	}

	devices.UseBusOrder() // cuda:N is the N-th GPU in PCI bus order, for the workers too
	devs := devices.NewProber(o.workersDir, o.backend, logrus.NewEntry(log))
	if _, err := devs.Discover(ctx); err != nil {
		return err
	}
	lanes, err := devices.ResolveLanes(o.lanes, devs.Found())
	if err != nil {
		fmt.Fprintln(stderr, "framepackd:", err)
		return errUsage
	}
	devs.SetLanes(lanes)

	// The lanes' watchdogs (watchdog.go), then the FramePack pipeline and its lanes (pipeline.go).
	guards, err := newGuards(o, devs, lanes, log)
	if err != nil {
		return err
	}
	defer guards.close()
	devices.CheckRuntime(devs, lanes, o.allowMismatch, guards.hold, logrus.NewEntry(log))
	if guardsHook != nil {
		guardsHook(guards) // tests hold a lane here (lanes_test.go)
	}
	o.pipeline.watchdog = guards.lookup
	o.pipeline.recovery = guards.recovery
	mets := newMetrics(guards.devices(devs.List), log) // /metrics (http.go)
	o.pipeline.onStage = mets.stage
	runJob, closeRunner, err := newRunner(o, devs, lanes, log)
	if err != nil {
		return err
	}
	defer closeRunner()

	ready := newReadiness(inst, o.models, devs, log)
	// --cluster: jobs, files and events live in the cluster (cluster.go); left after the
	// daemon has stopped, its running jobs given back.
	clu, err := o.cluster.join(ctx, o.state, mets.Observe, log)
	if err != nil {
		return err
	}
	var daemonCluster api.Cluster
	if clu != nil {
		daemonCluster = clu
		defer func() {
			if err := clu.Close(); err != nil {
				log.WithError(err).Warn("leave the cluster")
			}
		}()
	}
	d, err := api.StartDaemon(api.DaemonConfig{
		StateDir: o.state,
		Listen:   listen,
		Lanes:    lanes,
		Run:      runJob,
		Devices:  ready.devices(guards.devices(o.pipeline.devices(devs.List))),
		Unload:   o.pipeline.unload,
		Grace:    o.grace,
		Log:      log,

		DiskBudget:           int64(o.limits.diskBudget),
		MinFreeBytes:         int64(o.limits.minFree),
		Retention:            jobs.Retention{MaxAge: o.limits.retentionAge, MaxBytes: int64(o.limits.retentionBytes)},
		Ready:                ready.ready,
		Admit:                ready.admit,
		Models:               ready.fit,
		MaxImagePixels:       o.limits.maxPixels,
		MaxConcurrentDecodes: o.limits.maxDecodes,
		MaxVideoBytes:        int(o.limits.maxVideoBytes),
		VideoLimits: video.Limits{MaxSeconds: o.limits.maxVideoSeconds, MaxFrames: o.limits.maxVideoFrames,
			MaxPixels: o.limits.maxVideoPixels},
		Placement: devices.Placement(devs, lanes, guards.health, o.pipeline.keptBytes, uint64(o.minJobGB*(1<<30))),
		// JobSpec.variant at submit: f1 needs its transformer (issue 19).
		CheckVariant: o.pipeline.checkVariant,
		// metrics from the event hub, the gRPC TCP listener's TLS and token (http.go)
		OnEvent:       mets.Observe,
		Listeners:     tcpGRPC,
		ServerOptions: grpcAuth,
		Cluster:       daemonCluster,
	})
	if err != nil {
		return err
	}
	if g := o.limits.socketGroup; g != "" {
		if err := api.ShareSocket(o.socket, g); err != nil {
			_ = d.Stop(context.Background())
			return err
		}
	}
	mets.attach(d)
	stopHTTP, httpErr, err := startHTTP(o, d, httpParts{metrics: mets.Handler(), page: web.Handler()}, log) // REST, /metrics, the page (http.go)
	if err != nil {
		d.Kill()
		return err
	}
	defer stopHTTP()
	log.WithField("lanes", strings.Join(lanes, ",")).Info("framepackd ready")
	stopNotify := guards.notify(ctx, d) // sd_notify READY, WATCHDOG pings (watchdog.go)

	var runErr error
	select {
	case <-ctx.Done():
		log.Info("signal received; stopping (a second signal kills at once)")
	case runErr = <-d.Err():
		log.WithError(runErr).Error("serving failed; stopping")
	case runErr = <-httpErr:
		log.WithError(runErr).Error("serving http failed; stopping")
	}
	stopSignals()
	stopNotify()
	stopHTTP()
	stopCtx, cancel := context.WithTimeout(context.Background(), o.grace+30*time.Second)
	defer cancel()
	if err := d.Stop(stopCtx); err != nil && runErr == nil {
		runErr = fmt.Errorf("stop: %w", err)
	}
	return runErr
}

// openShm makes this daemon's own shared-memory folder under dir, after removing the folders
// of daemons that are gone (never those of live ones).
func openShm(dir string, log logrus.FieldLogger) (*shm.Instance, error) {
	inst, removed, err := shm.OpenInstance(dir)
	if len(removed) > 0 {
		log.WithFields(logrus.Fields{"shm_root": dir, "removed": removed}).Info("removed stale shared-memory directories")
	}
	if inst == nil {
		return nil, fmt.Errorf("shared memory: %w", err)
	}
	if err != nil {
		log.WithError(err).WithField("shm_root", dir).Warn("remove stale shared-memory directories")
	}
	log.WithField("shm_dir", inst.Dir()).Debug("shared-memory folder")
	return inst, nil
}
