package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/events"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"github.com/framepackd/framepackd/supervisor/video"
	"github.com/sirupsen/logrus"
	"google.golang.org/grpc"
)

// DefaultGrace is how long a graceful stop lets running jobs reach a stage boundary before
// cancelling them.
const DefaultGrace = 30 * time.Second

// rpcDrainTimeout bounds how long a graceful stop waits for in-flight calls once the queue has
// drained and the watch streams have ended.
const rpcDrainTimeout = 5 * time.Second

// DaemonConfig is what a Daemon is made of.
type DaemonConfig struct {
	// StateDir holds the job store and the job directories; required.
	StateDir string
	// Listen are the addresses to serve on (a unix socket, optionally TCP); at least one, or
	// Listeners.
	Listen []Addr
	// Listeners are listeners already open to serve on too (a TLS-wrapped TCP listener); the
	// daemon closes them.
	Listeners []net.Listener
	// ServerOptions are added to the gRPC server's options (authentication interceptors).
	ServerOptions []grpc.ServerOption
	// Lanes are the lanes jobs run on; required.
	Lanes []string
	// Run runs one job (the pipeline's Runner.Run); required.
	Run func(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error)
	// Devices lists the devices; nil lists the lanes only.
	Devices func(ctx context.Context) ([]*framepackv1.Device, error)
	// Unload serves UnloadModels (Config.Unload).
	Unload func(lane string, models []string) ([]*framepackv1.UnloadedWorker, error)
	// DecodeImage checks submitted images; nil means DecodeImage.
	DecodeImage func([]byte) (int, int, error)
	// Placement chooses among the lanes (their health, free device memory); the zero value
	// takes the first free lane.
	Placement jobs.Placement
	// CheckVariant checks JobSpec.variant at submit (pipeline.Runner.CheckVariant); nil
	// accepts only i2v.
	CheckVariant func(name string) error
	// Grace is the graceful stop's grace period; 0 means DefaultGrace.
	Grace time.Duration
	// DiskBudget, MinFreeBytes and Ready are the API server's (Config); Retention deletes
	// old finished jobs (housekeeping.go); ReadyInterval is how often Ready is checked for
	// the health service (0: DefaultReadyInterval).
	DiskBudget   int64
	MinFreeBytes int64
	// MaxImagePixels and MaxConcurrentDecodes bound the submitted images (Config).
	MaxImagePixels       int64
	MaxConcurrentDecodes int
	// MaxVideoBytes and VideoLimits bound the input videos (Config).
	MaxVideoBytes int
	VideoLimits   video.Limits
	Ready         func() error
	Admit         func(spec *framepackv1.JobSpec) error
	// Models says what the served models take (Config.Models); nil: FramePack's.
	Models        func() ModelFit
	ReadyInterval time.Duration
	Retention     jobs.Retention
	// Log is the daemon's logger; nil discards.
	Log logrus.FieldLogger
	// OnEvent, when set, sees every job event the hub publishes (events.Config.Observe).
	// A cluster's events are observed by the cluster (supervisor/cluster.Config.Observe).
	OnEvent func(*framepackv1.JobEvent)
	// Cluster, when set, makes the daemon one of a cluster of daemons sharing one queue
	// (supervisor/cluster): jobs, their files and events live in the cluster, and StateDir
	// only holds this daemon's working copies of the jobs it runs. Nil on a single host.
	Cluster Cluster
}

// Daemon is a running framepackd: the job store, the event hub, the queue and the gRPC
// server on its listeners.
type Daemon struct {
	cfg      DaemonConfig
	log      logrus.FieldLogger
	local    *jobs.Store // the single host's store; nil in a cluster
	store    Store
	hub      Events
	queue    *jobs.Queue
	server   *Server
	grpc     *grpc.Server
	stopQ    context.CancelFunc
	addrs    []net.Addr
	serveErr chan error
	wg       sync.WaitGroup
	stopOnce sync.Once
	stopErr  error
}

// StartDaemon opens the store, takes up unfinished jobs, and starts serving.
func StartDaemon(cfg DaemonConfig) (_ *Daemon, err error) {
	if len(cfg.Listen)+len(cfg.Listeners) == 0 {
		return nil, fmt.Errorf("start daemon: no address to listen on")
	}
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	log := cfg.Log
	if log == nil {
		l := logrus.New()
		l.SetOutput(discard{})
		log = l
	}
	d := &Daemon{cfg: cfg, log: log, serveErr: make(chan error, len(cfg.Listen)+len(cfg.Listeners))}
	var cleanup []func()
	defer func() {
		if err != nil {
			for i := len(cleanup) - 1; i >= 0; i-- {
				cleanup[i]()
			}
		}
	}()
	qcfg := jobs.Config{Lanes: cfg.Lanes, Run: cfg.Run, Placement: cfg.Placement, Log: log}
	if c := cfg.Cluster; c != nil {
		cs := c.Store()
		d.store, d.hub, qcfg.Store, qcfg.Shared = cs, c.Events(), cs, c.Queue()
	} else {
		if d.local, err = jobs.Open(cfg.StateDir); err != nil {
			return nil, fmt.Errorf("start daemon: %w", err)
		}
		d.store, qcfg.Store = LocalStore{d.local}, d.local
		hub, err := events.New(events.Config{Persist: d.local.AppendEvent, Load: d.local.Events, Log: log, Observe: cfg.OnEvent})
		if err != nil {
			_ = d.local.Close()
			return nil, fmt.Errorf("start daemon: %w", err)
		}
		d.hub = hub
	}
	cleanup = append(cleanup, func() { d.store.Close() })
	cleanup = append(cleanup, d.hub.Close)
	qcfg.Publish, qcfg.Sections = d.hub.Publish, plan.TotalSections
	if d.queue, err = jobs.NewQueue(qcfg); err != nil {
		return nil, fmt.Errorf("start daemon: %w", err)
	}
	var presets PresetStore // a cluster keeps none yet
	if d.local != nil {
		presets = d.local
	}
	if d.server, err = New(Config{Store: d.store, Queue: d.queue, Hub: d.hub, Devices: cfg.Devices, Unload: cfg.Unload, DecodeImage: cfg.DecodeImage, CheckVariant: cfg.CheckVariant, Log: log,
		DiskBudget: cfg.DiskBudget, MinFreeBytes: cfg.MinFreeBytes, Ready: cfg.Ready, Admit: cfg.Admit, Models: cfg.Models,
		MaxImagePixels: cfg.MaxImagePixels, MaxConcurrentDecodes: cfg.MaxConcurrentDecodes,
		MaxVideoBytes: cfg.MaxVideoBytes, VideoLimits: cfg.VideoLimits, Presets: presets}); err != nil {
		return nil, fmt.Errorf("start daemon: %w", err)
	}
	var listeners []net.Listener
	for _, l := range cfg.Listeners {
		cleanup = append(cleanup, func() { l.Close() })
		listeners = append(listeners, l)
		d.addrs = append(d.addrs, l.Addr())
	}
	for _, a := range cfg.Listen {
		l, err := Listen(a)
		if err != nil {
			return nil, fmt.Errorf("start daemon: %w", err)
		}
		cleanup = append(cleanup, func() { l.Close() })
		listeners = append(listeners, l)
		d.addrs = append(d.addrs, l.Addr())
	}
	qctx, stopQ := context.WithCancel(context.Background())
	d.stopQ = stopQ
	cleanup = append(cleanup, stopQ)
	if err := d.queue.Start(qctx); err != nil {
		return nil, fmt.Errorf("start daemon: %w", err)
	}
	d.grpc = d.server.GRPCServer(cfg.ServerOptions...)
	d.server.refreshReady() // health says the truth from the first call on
	go d.housekeep(qctx)
	for _, l := range listeners {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			if err := d.grpc.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				d.serveErr <- fmt.Errorf("serve %s: %w", l.Addr(), err)
			}
		}()
		log.WithFields(logrus.Fields{"network": l.Addr().Network(), "addr": l.Addr().String()}).Info("listening")
	}
	return d, nil
}

// Addrs returns the addresses the daemon listens on (a TCP port 0 resolved).
func (d *Daemon) Addrs() []net.Addr { return d.addrs }

// Store returns the single host's job store; nil in a cluster (Jobs serves both).
func (d *Daemon) Store() *jobs.Store { return d.local }

// Jobs returns the store the API reads jobs from: the single host's, or the cluster's.
func (d *Daemon) Jobs() Store { return d.store }

// Queue returns the job queue.
func (d *Daemon) Queue() *jobs.Queue { return d.queue }

// ListDevices lists the devices as DeviceService.ListDevices answers (the metrics read it).
func (d *Daemon) ListDevices(ctx context.Context) (*framepackv1.ListDevicesResponse, error) {
	return d.server.ListDevices(ctx, &framepackv1.ListDevicesRequest{})
}

// Err is sent an error when a listener fails.
func (d *Daemon) Err() <-chan error { return d.serveErr }

// Stop stops the daemon gracefully: health turns NOT_SERVING, no job starts any more, running
// jobs get the grace period to stop at a stage boundary and are then cancelled (they stay
// queued and resume at the next start, from their last finished section), watch streams end
// with UNAVAILABLE, in-flight calls finish, and the store is closed. ctx bounds the whole stop;
// when it ends first, the rest is done without waiting.
func (d *Daemon) Stop(ctx context.Context) error {
	d.stopOnce.Do(func() {
		d.server.Stopping()
		d.log.WithField("grace", d.cfg.Grace).Info("stopping: draining the job queue")
		if err := d.queue.Drain(ctx, d.cfg.Grace); err != nil {
			d.log.WithError(err).Warn("drain did not finish; stopping the queue")
			d.stopErr = err
		}
		d.shutdown(ctx)
	})
	return d.stopErr
}

// Kill stops the daemon at once, as a crash would as far as jobs go: running jobs are
// cancelled and stay RUNNING in the store, to resume at the next start.
func (d *Daemon) Kill() {
	d.stopOnce.Do(func() {
		d.stopQ()
		<-d.queue.Stopped()
		d.hub.Close()
		d.server.Shutdown()
		d.grpc.Stop()
		d.wg.Wait()
		_ = d.store.Close()
	})
}

func (d *Daemon) shutdown(ctx context.Context) {
	d.stopQ()
	<-d.queue.Stopped()
	d.hub.Close() // ends watch streams
	d.server.Shutdown()
	stopped := make(chan struct{})
	go func() {
		d.grpc.GracefulStop()
		close(stopped)
	}()
	timer := time.NewTimer(rpcDrainTimeout)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-ctx.Done():
		d.grpc.Stop()
		<-stopped
	case <-timer.C:
		// A client holds a stream open (reflection, a forgotten watch): cut it.
		d.log.Warn("rpcs still open after the drain timeout; closing them")
		d.grpc.Stop()
		<-stopped
	}
	d.wg.Wait()
	if err := d.store.Close(); err != nil && d.stopErr == nil {
		d.stopErr = err
	}
	d.log.Info("stopped")
}
