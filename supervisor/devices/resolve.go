package devices

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
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

// ResolveLanes turns the --lanes syntax into lane names. found are the probed devices by lane
// ("cpu", "cuda:0", …). Entries: "auto" (one lane per probed device: every GPU, or the cpu
// when there is none), "cpu" and "cpu:N" (several lanes on the host CPU, e.g. "cpu:0,cpu:1"),
// "cuda:N" / "hip:N" (the device of that index), or a PCI bus id ("0000:03:00.0", the probed
// GPU at that address). An empty spec is "auto".
func ResolveLanes(spec string, found map[string]*framepackv1.Device) ([]string, error) {
	var out []string
	seen := map[string]bool{}
	add := func(lane string) error {
		if seen[lane] {
			return fmt.Errorf("--lanes %q: lane %s named twice", spec, lane)
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
		var lanes []string
		switch {
		case e == "":
		case e == "auto":
			for lane := range found {
				lanes = append(lanes, lane)
			}
			SortLanes(lanes)
		case pciBusID.MatchString(e):
			for name, d := range found {
				if d.GetPciBusId() != "" && normBusID(d.GetPciBusId()) == normBusID(e) {
					lanes = []string{name}
				}
			}
			if len(lanes) == 0 {
				return nil, fmt.Errorf("--lanes %q: no probed GPU at PCI address %s (framepack devices lists them)", spec, e)
			}
		default:
			l, err := ParseLane(e)
			if err != nil {
				return nil, fmt.Errorf("--lanes %q: %w (or auto, or a GPU's PCI bus id)", spec, err)
			}
			lanes = []string{l.String()}
		}
		for _, lane := range lanes {
			if err := add(lane); err != nil {
				return nil, err
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("--lanes %q names no lane", spec)
	}
	return out, nil
}

// LaneDevice returns the probed device a lane drives (found by lane, as Prober.Found returns
// them): "cpu:N" lanes all drive the host CPU.
func LaneDevice(found map[string]*framepackv1.Device, lane string) (*framepackv1.Device, bool) {
	if d, ok := found[lane]; ok {
		return d, true
	}
	if BackendOf(lane) == BackendCPU {
		if d, ok := found[BackendCPU]; ok {
			return d, true
		}
	}
	return nil, false
}

// UseBusOrder makes CUDA number the devices in PCI bus order, the order NVML (and so the probe
// and the lanes' "cuda:N" names) uses; CUDA's default puts the fastest first. Workers inherit
// the daemon's environment. An operator's own setting is kept.
func UseBusOrder() {
	if _, ok := os.LookupEnv("CUDA_DEVICE_ORDER"); !ok {
		_ = os.Setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
	}
}
