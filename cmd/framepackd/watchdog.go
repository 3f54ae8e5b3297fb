package main

// The watchdog's part of the daemon (supervisor/watchdog): one watchdog per lane — hangs seen
// from the workers' beacons, the VRAM recovery check after every worker, device probes with
// backoff after crashes, the degradation ladder and retry budgets — the lanes' health in
// ListDevices, and sd_notify READY/WATCHDOG for systemd (deploy/framepackd.service).

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/convcache"
	gpudevices "github.com/framepackd/framepackd/internal/devices"
	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
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
// laneMemory, none on the CPU (the recovery check then waits for the worker's process group to
// be gone), and the probe worker to check a device after a crash.
func newGuards(o *options, devs *devices, laneNames []string, log *logrus.Logger) (*guards, error) {
	cache, err := convcache.Open(filepath.Join(o.state, convCacheFile))
	if err != nil {
		return nil, err
	}
	if lerr := cache.LoadError(); lerr != nil {
		log.WithError(lerr).Warn("conv decision cache unreadable; it starts empty")
	}
	g := &guards{byLane: map[string]*watchdog.Watchdog{}, checks: map[string]*watchdog.Recovery{}, log: logrus.NewEntry(log)}
	for _, name := range laneNames {
		backend, idx, err := laneBackend(name)
		if err != nil {
			g.close()
			return nil, err
		}
		devs.mu.Lock()
		dev := devs.last[name]
		devs.mu.Unlock()
		var mem watchdog.Memory
		if dev == nil {
			// No device for this lane in the probe: the lane stays (ListDevices shows it
			// degraded, readiness refuses jobs pinned to it) but has no memory to watch.
			g.log.WithField("lane", name).Warn("no device for this lane in the probe: it takes no jobs until one is found")
		} else if mem, err = laneMemory(name, backend, dev); err != nil {
			g.close()
			return nil, err
		}
		probe := watchdog.ProbeWorker(workerkit.Config{Name: "probe", Path: filepath.Join(o.workersDir, "probe"), Log: g.log},
			backend, idx, watchdog.DefaultProbeAllocate)
		cfg := watchdog.Config{Lane: name, LaneBackend: backend, ConvCache: cache,
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

// laneMemory returns the used-memory reader of a GPU lane's device (nil on the CPU).
//
// Devices are read through two deliberate paths and no third:
//   - what devices exist (name, arch, total memory, PCI bus id) comes from the probe worker
//     (devices.go), in a throwaway process: initialising a vendor runtime may crash, and a crash
//     there must not take the daemon down (ARCHITECTURE.md §6);
//   - the used-memory figure the VRAM recovery check polls every 250 ms comes from
//     internal/devices in this process, by the bus id the probe reported: NVML's
//     nvmlDeviceGetHandleByPciBusId_v2 on cuda, amdgpu's sysfs files on hip. Reading a figure
//     creates no context and loads no kernel code onto the device, so it cannot crash the way
//     vendor initialisation can, and spawning a process four times a second would cost more
//     than the figure. By bus id, the lane reads the GPU its workers run on even on a host
//     whose GPUs the runtime and the driver number differently.
//
// A GPU device without a bus id is a configuration error, not a reason to guess by index.
func laneMemory(lane, backend string, dev *framepackv1.Device) (watchdog.Memory, error) {
	if backend != gpudevices.BackendCUDA && backend != gpudevices.BackendHIP {
		return nil, nil
	}
	bus := dev.GetPciBusId()
	if bus == "" {
		return nil, fmt.Errorf("lane %s: the probe reported no PCI bus id for this device, so its memory cannot be watched (is the lane's device present?)", lane)
	}
	r, err := gpudevices.NewReader(gpudevices.Device{Backend: backend, PCIBusID: bus}, gpudevices.Options{})
	if err != nil {
		return nil, fmt.Errorf("lane %s: %w", lane, err)
	}
	return namedReader{r, fmt.Sprintf("%s %s", backend, bus)}, nil
}

// namedReader gives an internal/devices reader the name the watchdog logs.
type namedReader struct {
	gpudevices.Reader
	name string
}

// Name says where the figure comes from.
func (r namedReader) Name() string { return r.name }

// lookup returns the watchdog of a lane (nil for an unknown lane: its stages run once).
func (g *guards) lookup(lane string) *watchdog.Watchdog { return g.byLane[lane] }

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
