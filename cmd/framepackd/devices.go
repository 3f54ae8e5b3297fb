package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/proto"
)

// probeTimeout bounds one probe worker: start, handshake, probe.
const probeTimeout = 30 * time.Second

// devices finds the compute devices with the probe worker, in a throwaway process so that a
// driver crash while probing cannot take the daemon down, and lists them for DeviceService.
type devices struct {
	workersDir string
	backend    string
	log        *logrus.Entry
	lanes      []string // the daemon's lanes, set after discover

	// mu protects last, the devices of the last successful probe, by lane, and runtime, its
	// GPU runtime and driver versions (nil on the cpu).
	mu      sync.Mutex
	last    map[string]*framepackv1.Device
	runtime *workerkit.RuntimeVersions
}

// probe runs the probe worker once and returns its devices by lane name.
func (d *devices) probe(ctx context.Context) (map[string]*framepackv1.Device, error) {
	path := filepath.Join(d.workersDir, "probe")
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("probe devices: worker binary: %w (set --workers-dir)", err)
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	p, err := workerkit.Start(ctx, workerkit.Config{Name: "probe", Path: path, Log: d.log})
	if err != nil {
		return nil, fmt.Errorf("probe devices: %w", err)
	}
	defer p.Close()
	resp, err := p.Probe(ctx, &workerkit.ProbeRequest{Backend: d.backend})
	if err != nil {
		return nil, fmt.Errorf("probe %s devices: %w", d.backend, err)
	}
	out := make(map[string]*framepackv1.Device, len(resp.Devices))
	for _, dev := range resp.Devices {
		lane := resp.Backend
		if resp.Backend != "cpu" {
			lane += ":" + strconv.Itoa(int(dev.Index))
		}
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
		return nil, fmt.Errorf("probe %s devices: none found", d.backend)
	}
	d.mu.Lock()
	d.runtime = resp.Runtime
	d.mu.Unlock()
	return out, nil
}

// discover probes the devices and returns one lane per device, in index order.
func (d *devices) discover(ctx context.Context) ([]string, error) {
	found, err := d.probe(ctx)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.last = found
	d.mu.Unlock()
	lanes := make([]string, 0, len(found))
	for lane := range found {
		lanes = append(lanes, lane)
	}
	sortLanes(lanes)
	for _, lane := range lanes {
		dev := found[lane]
		d.log.WithFields(logrus.Fields{"lane": lane, "device": dev.GetName(), "arch": dev.GetArch(), "memory_bytes": dev.GetTotalMemoryBytes()}).Info("device found")
	}
	return lanes, nil
}

// list is DeviceService.ListDevices's source: a fresh probe (memory figures change), falling
// back to the last one when probing fails; one device per lane of the daemon.
func (d *devices) list(ctx context.Context) ([]*framepackv1.Device, error) {
	found, err := d.probe(ctx)
	d.mu.Lock()
	if err == nil {
		d.last = found
	} else {
		d.log.WithError(err).Warn("device probe failed; reporting the last known devices")
		found = d.last
	}
	d.mu.Unlock()
	out := make([]*framepackv1.Device, 0, len(d.lanes))
	for _, lane := range d.lanes {
		dev, ok := laneDevice(found, lane)
		if ok && dev.GetLane() != lane {
			dev = proto.Clone(dev).(*framepackv1.Device) // another cpu lane
			dev.Lane = lane
		}
		if !ok {
			dev = &framepackv1.Device{Lane: lane, Backend: api.LaneBackend(lane), LaneState: framepackv1.LaneState_LANE_STATE_DEGRADED,
				LaneStateReason: "no device for this lane in the last probe"}
		}
		out = append(out, dev)
	}
	return out, nil
}

func sortLanes(lanes []string) {
	for i := 1; i < len(lanes); i++ {
		for j := i; j > 0 && laneLess(lanes[j], lanes[j-1]); j-- {
			lanes[j], lanes[j-1] = lanes[j-1], lanes[j]
		}
	}
}

// laneLess orders lanes by backend, then by device index as a number ("cuda:2" < "cuda:10").
func laneLess(a, b string) bool {
	ba, bb := api.LaneBackend(a), api.LaneBackend(b)
	if ba != bb {
		return ba < bb
	}
	ia, _ := strconv.Atoi(a[min(len(ba)+1, len(a)):])
	ib, _ := strconv.Atoi(b[min(len(bb)+1, len(b)):])
	return ia < ib
}
