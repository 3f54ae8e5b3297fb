package main

// The watchdog's part of the daemon (supervisor/watchdog): one watchdog per lane — hangs seen
// from the workers' beacons, the VRAM recovery check after every worker, device probes with
// backoff after crashes, the degradation ladder and retry budgets — the lanes' health in
// ListDevices, and sd_notify READY/WATCHDOG for systemd (deploy/framepackd.service).

import (
	"context"
	"errors"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/devices"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// convCacheFile is the conv decision cache in the state directory, shared by every worker.
const convCacheFile = "conv-decisions.json"

// guards are the lanes' watchdogs.
type guards struct {
	byLane map[string]*watchdog.Watchdog
	list   []*watchdog.Watchdog
	// checks are the lanes' memory-recovery checks, which the lanes also run after killing a
	// kept worker outside a stage.
	checks map[string]*watchdog.Recovery
	log    *logrus.Entry
}

// recovery is lane's memory check as the lane calls it (nil without a watchdog).
func (g *guards) recovery(lane string) lanes.Recovery {
	if r := g.checks[lane]; r != nil {
		return laneRecovery{r}
	}
	return nil
}

// laneRecovery adapts the watchdog's recovery check to lanes.Recovery.
type laneRecovery struct{ r *watchdog.Recovery }

func (l laneRecovery) Baseline(ctx context.Context) (uint64, error) { return l.r.Baseline(ctx) }

func (l laneRecovery) Check(ctx context.Context, baseline uint64, pgid int) (bool, string) {
	res := l.r.Check(ctx, baseline, pgid)
	return res.Recovered, res.String()
}

// newGuards makes one watchdog per lane, with the lane's device memory read through
// devices.MemoryReader, none on the CPU (the recovery check then waits for the worker's process group to
// be gone), and the probe worker to check a device after a crash.
func newGuards(o *options, devs *devices.Prober, laneNames []string, log *logrus.Logger) (*guards, error) {
	cache, err := convcache.Open(filepath.Join(o.state, convCacheFile))
	if err != nil {
		return nil, err
	}
	if lerr := cache.LoadError(); lerr != nil {
		log.WithError(lerr).Warn("conv decision cache unreadable; it starts empty")
	}
	g := &guards{byLane: map[string]*watchdog.Watchdog{}, checks: map[string]*watchdog.Recovery{}, log: logrus.NewEntry(log)}
	for _, name := range laneNames {
		lane, err := devices.ParseLane(name)
		if err != nil {
			g.close()
			return nil, err
		}
		dev := devs.Device(name)
		var mem watchdog.Memory
		if dev == nil {
			// No device for this lane in the probe: the lane stays (ListDevices shows it
			// degraded, readiness refuses jobs pinned to it) but has no memory to watch.
			g.log.WithField("lane", name).Warn("no device for this lane in the probe: it takes no jobs until one is found")
		} else if r, err := devices.MemoryReader(lane, dev); err != nil {
			g.close()
			return nil, err
		} else if r != nil {
			mem = r
		}
		probe := watchdog.ProbeWorker(workerkit.Config{Name: "probe", Path: filepath.Join(o.workersDir, "probe"), Log: g.log},
			lane.Backend, lane.Device(), watchdog.DefaultProbeAllocate)
		cfg := watchdog.Config{Lane: name, LaneBackend: lane.Backend, ConvCache: cache,
			Recovery: &watchdog.Recovery{Memory: mem}, Probe: probe, Log: g.log}
		o.ops.apply(&cfg) // --hang-deadline-scale, --retries-per-*, --vram-recovery-wait (ops.go)
		g.checks[name] = cfg.Recovery
		wd, err := watchdog.New(cfg)
		if err != nil {
			g.close()
			return nil, err
		}
		g.byLane[name] = wd
		g.list = append(g.list, wd)
		f := g.log.WithField("lane", name)
		if mem != nil {
			f = f.WithField("device_memory", mem.Name())
		}
		f.Debug("lane watchdog ready")
	}
	return g, nil
}

// lookup returns the watchdog of a lane (nil for an unknown lane: its stages run once).
func (g *guards) lookup(lane string) *watchdog.Watchdog { return g.byLane[lane] }

// health returns the health of a lane's watchdog for the job queue's placement (nil for a
// lane without one: always ready).
func (g *guards) health(lane string) jobs.LaneHealth {
	if w := g.lookup(lane); w != nil {
		return w.Health()
	}
	return nil
}

// hold holds a lane (its watchdog's health) for reason; a lane without a watchdog has none.
func (g *guards) hold(lane, reason string) {
	if w := g.lookup(lane); w != nil {
		w.Health().Hold(reason)
	}
}

// guardsHook, when set (by tests of this package only), is called with the lanes' watchdogs
// before the daemon takes jobs.
var guardsHook func(*guards)

// close stops the watchdogs' monitors.
func (g *guards) close() {
	for _, w := range g.list {
		w.Close()
	}
}

// devices wraps a ListDevices source with the lanes' health (held, degraded, and why).
func (g *guards) devices(list func(context.Context) ([]*framepackv1.Device, error)) func(context.Context) ([]*framepackv1.Device, error) {
	return func(ctx context.Context) ([]*framepackv1.Device, error) {
		devs, err := list(ctx)
		if err != nil {
			return nil, err
		}
		for _, d := range devs {
			if w := g.byLane[d.GetLane()]; w != nil && w.Health().Status().State != watchdog.LaneHealthy {
				w.Health().Annotate(d)
			}
		}
		return devs, nil
	}
}

// notify tells systemd the daemon is ready and pings its watchdog while the job queue
// answers; the returned stop sends STOPPING=1 and ends the pings. Outside systemd it does
// nothing.
func (g *guards) notify(ctx context.Context, d *api.Daemon) (stop func()) {
	n := watchdog.NewNotifier(g.log)
	if err := n.Ready(watchdog.LanesStatus(g.list)); err != nil {
		g.log.WithError(err).Warn("sd_notify READY")
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		healthy := func(ctx context.Context) error {
			answered := make(chan struct{})
			go func() { d.Queue().Running(); close(answered) }()
			select {
			case <-answered:
				return nil
			case <-ctx.Done():
				return errors.New("the job queue does not answer")
			}
		}
		if err := n.Run(ctx, healthy, func() string { return watchdog.LanesStatus(g.list) }); err != nil {
			g.log.WithError(err).Warn("systemd watchdog")
		}
	}()
	return func() {
		cancel()
		<-done
		if err := n.Stopping(); err != nil {
			g.log.WithError(err).Debug("sd_notify STOPPING")
		}
	}
}
