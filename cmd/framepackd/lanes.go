package main

// Lanes on a host with several devices: the --lanes syntax, one lane per device selected by
// index or PCI bus id, several CPU lanes, and the job queue's placement over them (health,
// free device memory).

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	gpudevices "github.com/framepackd/framepackd/internal/devices"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/api"
	"github.com/framepackd/framepackd/supervisor/jobs"
)

// pciBusID matches a PCI address as drivers print it ("0000:03:00.0", or "03:00.0" without
// the domain).
var pciBusID = regexp.MustCompile(`^(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$`)

// normBusID returns a PCI address with its domain, lower-case ("0000:03:00.0").
func normBusID(s string) string {
	s = strings.ToLower(s)
	if strings.Count(s, ":") == 1 {
		s = "0000:" + s
	}
	if i := strings.Index(s, ":"); i > 4 { // NVML prints an 8-digit domain
		s = s[i-4:]
	}
	return s
}

// resolveLanes turns --lanes into lane names. found are the probed devices by lane ("cpu",
// "cuda:0", …). Entries: "auto" (one lane per probed device: every GPU, or the cpu when there
// is none), "cpu" and "cpu:N" (several lanes on the host CPU, e.g. "cpu:0,cpu:1"), "cuda:N" /
// "hip:N" (the device of that index), or a PCI bus id ("0000:03:00.0", the probed GPU at that
// address). An empty spec is "auto".
func resolveLanes(spec string, found map[string]*framepackv1.Device) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	add := func(lane string) error {
		if seen[lane] {
			return fmt.Errorf("lane %s named twice", lane)
		}
		seen[lane] = true
		out = append(out, lane)
		return nil
	}
	if strings.TrimSpace(spec) == "" {
		spec = "auto"
	}
	for _, e := range strings.Split(spec, ",") {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			continue
		case e == "auto":
			auto := make([]string, 0, len(found))
			for lane := range found {
				auto = append(auto, lane)
			}
			sortLanes(auto)
			for _, lane := range auto {
				if err := add(lane); err != nil {
					return nil, fmt.Errorf("--lanes %q: %w", spec, err)
				}
			}
		case pciBusID.MatchString(e):
			lane := ""
			for name, d := range found {
				if d.GetPciBusId() != "" && normBusID(d.GetPciBusId()) == normBusID(e) {
					lane = name
				}
			}
			if lane == "" {
				return nil, fmt.Errorf("--lanes %q: no probed GPU at PCI address %s (framepack devices lists them)", spec, e)
			}
			if err := add(lane); err != nil {
				return nil, fmt.Errorf("--lanes %q: %w", spec, err)
			}
		default:
			backend, _, err := laneBackend(e)
			if err != nil {
				return nil, fmt.Errorf("--lanes %q: %w", spec, err)
			}
			switch backend {
			case "cpu", "cuda", "hip":
			default:
				return nil, fmt.Errorf("--lanes %q: %q is not a lane: want auto, cpu, cpu:N, cuda:N, hip:N or a PCI bus id", spec, e)
			}
			if err := add(e); err != nil {
				return nil, fmt.Errorf("--lanes %q: %w", spec, err)
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--lanes %q names no lane", spec)
	}
	return out, nil
}

// laneDevice returns the probed device a lane drives: "cpu:N" lanes all drive the host CPU.
func laneDevice(found map[string]*framepackv1.Device, lane string) (*framepackv1.Device, bool) {
	if d, ok := found[lane]; ok {
		return d, true
	}
	if api.LaneBackend(lane) == "cpu" {
		if d, ok := found["cpu"]; ok {
			return d, true
		}
	}
	return nil, false
}

// useBusOrder makes CUDA number the devices in PCI bus order, the order NVML (and so the
// probe and the lanes' "cuda:N" names) uses; CUDA's default puts the fastest first. Workers
// inherit the daemon's environment. An operator's own setting is kept.
func useBusOrder() {
	if _, ok := os.LookupEnv("CUDA_DEVICE_ORDER"); !ok {
		_ = os.Setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
	}
}

// placement is the job queue's view of the lanes: their watchdogs' health, and free device
// memory read from the driver by PCI bus id (NVML, amdgpu sysfs; none on the cpu).
type placement struct {
	guards  *guards
	readers map[string]gpudevices.Reader
	total   map[string]uint64
	minNeed uint64
	// kept is the memory a lane's kept workers hold (their caps): free for a job placed there,
	// since the lane kills them when a stage needs it (nil: none kept).
	kept func(lane string) uint64
}

// newPlacement builds the placement of lanes. minNeedGB is the device memory a job needs
// besides its gpu_memory_preservation_gb.
func newPlacement(g *guards, devs *devices, laneNames []string, minNeedGB float64) *placement {
	p := &placement{guards: g, readers: map[string]gpudevices.Reader{}, total: map[string]uint64{},
		minNeed: uint64(minNeedGB * (1 << 30))}
	devs.mu.Lock()
	defer devs.mu.Unlock()
	for _, lane := range laneNames {
		backend, _, err := laneBackend(lane)
		if err != nil || (backend != gpudevices.BackendCUDA && backend != gpudevices.BackendHIP) {
			continue
		}
		d := devs.last[lane]
		if d.GetPciBusId() == "" || d.GetTotalMemoryBytes() == 0 {
			continue
		}
		r, err := gpudevices.NewReader(gpudevices.Device{Backend: backend, PCIBusID: d.GetPciBusId()}, gpudevices.Options{})
		if err != nil {
			continue
		}
		p.readers[lane], p.total[lane] = r, d.GetTotalMemoryBytes()
	}
	return p
}

// guardsHook, when set (by tests of this package only), is called with the lanes' watchdogs
// before the daemon takes jobs.
var guardsHook func(*guards)

// readTimeout bounds one device memory read while placing a job.
const readTimeout = 2 * time.Second

// jobs returns the queue's Placement.
func (p *placement) jobs() jobs.Placement {
	return jobs.Placement{
		Health: func(lane string) jobs.LaneHealth {
			if w := p.guards.lookup(lane); w != nil {
				return w.Health()
			}
			return nil
		},
		FreeBytes: func(lane string) (uint64, bool) {
			r := p.readers[lane]
			if r == nil {
				return 0, false
			}
			ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
			defer cancel()
			used, err := r.Used(ctx)
			if err != nil {
				return 0, false
			}
			free := p.total[lane] - min(used, p.total[lane])
			if p.kept != nil {
				free = min(free+p.kept(lane), p.total[lane])
			}
			return free, true
		},
		TotalBytes: func(lane string) (uint64, bool) {
			t, ok := p.total[lane]
			return t, ok
		},
		NeedBytes: func(spec *framepackv1.JobSpec) uint64 {
			return p.minNeed + uint64(float64(spec.GetGpuMemoryPreservationGb())*(1<<30))
		},
	}
}

// laneIndexOf parses the device index of "backend:N" ("cpu:N" lanes all use device 0).
func laneIndexOf(lane string) (uint32, error) {
	backend, idx, ok := strings.Cut(lane, ":")
	if !ok || backend == "cpu" {
		return 0, nil
	}
	n, err := strconv.ParseUint(idx, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("lane %q: bad device index", lane)
	}
	return uint32(n), nil
}
