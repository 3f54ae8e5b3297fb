package devices

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// ProbeTimeout bounds one probe worker: start, handshake, probe.
const ProbeTimeout = 30 * time.Second

// Prober finds the compute devices with the probe worker, in a throwaway process so that a
// driver crash while probing cannot take the daemon down, and lists them, one per lane, for
// DeviceService. It is safe for concurrent use.
type Prober struct {
	workersDir string
	backend    string
	log        *logrus.Entry

	// mu protects the fields below: the daemon's lanes (SetLanes), the devices of the last
	// successful probe by lane, and its GPU runtime and driver versions (nil on the cpu).
	mu      sync.Mutex
	lanes   []string
	last    map[string]*framepackv1.Device
	runtime *workerkit.RuntimeVersions
}

// NewProber returns a prober that runs the probe worker of workersDir for backend ("auto",
// "cpu", "cuda" or "hip").
func NewProber(workersDir, backend string, log *logrus.Entry) *Prober {
	return &Prober{workersDir: workersDir, backend: backend, log: log}
}

// probe runs the probe worker once and returns its devices by lane name.
func (p *Prober) probe(ctx context.Context) (map[string]*framepackv1.Device, error) {
	path := filepath.Join(p.workersDir, "probe")
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("probe devices: worker binary: %w (set --workers-dir)", err)
	}
	ctx, cancel := context.WithTimeout(ctx, ProbeTimeout)
	defer cancel()
	w, err := workerkit.Start(ctx, workerkit.Config{Name: "probe", Path: path, Log: p.log})
	if err != nil {
		return nil, fmt.Errorf("probe devices: %w", err)
	}
	defer w.Close()
	resp, err := w.Probe(ctx, &workerkit.ProbeRequest{Backend: p.backend})
	if err != nil {
		return nil, fmt.Errorf("probe %s devices: %w", p.backend, err)
	}
	out := make(map[string]*framepackv1.Device, len(resp.Devices))
	for _, dev := range resp.Devices {
		lane := Lane{Backend: resp.Backend, Index: dev.Index, numbered: resp.Backend != BackendCPU}.String()
		out[lane] = &framepackv1.Device{
			Lane:             lane,
			Index:            dev.Index,
			Name:             dev.Name,
			Arch:             dev.Arch,
			Backend:          resp.Backend,
			TotalMemoryBytes: dev.TotalMemoryBytes,
			UsedMemoryBytes:  dev.TotalMemoryBytes - min(dev.FreeMemoryBytes, dev.TotalMemoryBytes),
			PciBusId:         dev.PCIBusID,
			LaneState:        framepackv1.LaneState_LANE_STATE_HEALTHY,
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("probe %s devices: none found", p.backend)
	}
	p.mu.Lock()
	p.runtime = resp.Runtime
	p.mu.Unlock()
	return out, nil
}

// Discover probes the devices and returns one lane per device, in lane order.
func (p *Prober) Discover(ctx context.Context) ([]string, error) {
	found, err := p.probe(ctx)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.last = found
	p.mu.Unlock()
	lanes := make([]string, 0, len(found))
	for lane := range found {
		lanes = append(lanes, lane)
	}
	SortLanes(lanes)
	for _, lane := range lanes {
		dev := found[lane]
		p.log.WithFields(logrus.Fields{"lane": lane, "device": dev.GetName(), "arch": dev.GetArch(), "memory_bytes": dev.GetTotalMemoryBytes()}).Info("device found")
	}
	return lanes, nil
}

// SetLanes sets the daemon's lanes, the ones List and Known report.
func (p *Prober) SetLanes(lanes []string) {
	p.mu.Lock()
	p.lanes = append([]string(nil), lanes...)
	p.mu.Unlock()
}

// Found returns the devices of the last successful probe by lane (a copy of the map).
func (p *Prober) Found() map[string]*framepackv1.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.last)
}

// Device returns the device lane drives in the last probe (nil when it has none).
func (p *Prober) Device(lane string) *framepackv1.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	d, _ := LaneDevice(p.last, lane)
	return d
}

// Runtime returns the GPU runtime and driver versions of the last probe (nil on the cpu).
func (p *Prober) Runtime() *workerkit.RuntimeVersions {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.runtime
}

// List is DeviceService.ListDevices's source: a fresh probe (memory figures change), falling
// back to the last one when probing fails; one device per lane of the daemon.
func (p *Prober) List(ctx context.Context) ([]*framepackv1.Device, error) {
	found, err := p.probe(ctx)
	p.mu.Lock()
	if err == nil {
		p.last = found
	} else {
		p.log.WithError(err).Warn("device probe failed; reporting the last known devices")
		found = p.last
	}
	lanes := p.lanes
	p.mu.Unlock()
	return perLane(found, lanes), nil
}

// Known lists the daemon's lanes with the devices of the last probe, without probing again.
func (p *Prober) Known() []*framepackv1.Device {
	p.mu.Lock()
	defer p.mu.Unlock()
	return perLane(p.last, p.lanes)
}

// perLane returns a copy of the device of each lane in found (callers annotate theirs), under
// the lane's name (cpu lanes share the host's); a lane without one degraded, saying so.
func perLane(found map[string]*framepackv1.Device, lanes []string) []*framepackv1.Device {
	out := make([]*framepackv1.Device, 0, len(lanes))
	for _, lane := range lanes {
		dev, ok := LaneDevice(found, lane)
		if ok {
			dev = proto.Clone(dev).(*framepackv1.Device)
			dev.Lane = lane
		} else {
			dev = &framepackv1.Device{Lane: lane, Backend: BackendOf(lane), LaneState: framepackv1.LaneState_LANE_STATE_DEGRADED,
				LaneStateReason: "no device for this lane in the last probe"}
		}
		out = append(out, dev)
	}
	return out
}
