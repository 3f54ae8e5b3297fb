// Package devices is the daemon's view of its compute devices: the lane ids ("cpu", "cpu:1",
// "cuda:0", "hip:1") and the --lanes syntax, the probe that finds the devices in a throwaway
// worker process, the used-memory readers of GPU lanes, the placement figures the job queue
// reads, and the check that the GPU runtime the workers link can run on the host's driver.
package devices

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Backends a lane runs on.
const (
	BackendCPU  = "cpu"
	BackendCUDA = "cuda"
	BackendHIP  = "hip"
)

// Lane is a lane's id, parsed once from its name: the backend its workers load on and, on a
// GPU, the index of the device they open. Lanes on the cpu ("cpu", "cpu:0", "cpu:1") all drive
// the host CPU; their number only tells them apart.
type Lane struct {
	// Backend is BackendCPU, BackendCUDA or BackendHIP.
	Backend string
	// Index is the device index on a GPU ("cuda:1" → 1), the lane's own number on the cpu.
	Index uint32
	// numbered says a cpu lane's name carries its number ("cpu:0", not "cpu").
	numbered bool
}

// ParseLane parses a lane name: "cpu", "cpu:N", "cuda:N" or "hip:N".
func ParseLane(name string) (Lane, error) {
	backend, idx, numbered := strings.Cut(name, ":")
	switch backend {
	case BackendCPU, BackendCUDA, BackendHIP:
	default:
		return Lane{}, fmt.Errorf("%q is not a lane: want cpu, cpu:N, cuda:N or hip:N", name)
	}
	l := Lane{Backend: backend, numbered: numbered}
	if !numbered {
		if backend != BackendCPU {
			return Lane{}, fmt.Errorf("lane %q: a GPU lane names its device index (%s:0)", name, backend)
		}
		return l, nil
	}
	n, err := strconv.ParseUint(idx, 10, 32)
	if err != nil {
		return Lane{}, fmt.Errorf("lane %q: bad device index", name)
	}
	l.Index = uint32(n)
	return l, nil
}

// String returns the lane's name ("cuda:0").
func (l Lane) String() string {
	if l.Backend == BackendCPU && !l.numbered {
		return BackendCPU
	}
	return l.Backend + ":" + strconv.FormatUint(uint64(l.Index), 10)
}

// GPU reports whether the lane drives a GPU (cuda or hip).
func (l Lane) GPU() bool { return l.Backend == BackendCUDA || l.Backend == BackendHIP }

// Device returns the index of the device the lane's workers open on its backend: the GPU's
// index, 0 (the host) for every cpu lane.
func (l Lane) Device() uint32 {
	if !l.GPU() {
		return 0
	}
	return l.Index
}

// Compare orders lanes by backend, then by index as a number ("cuda:2" before "cuda:10"),
// "cpu" before "cpu:0".
func (l Lane) Compare(m Lane) int {
	if c := cmp.Compare(l.Backend, m.Backend); c != 0 {
		return c
	}
	if l.numbered != m.numbered {
		if !l.numbered {
			return -1
		}
		return 1
	}
	return cmp.Compare(l.Index, m.Index)
}

// BackendOf returns the backend of a lane name, "" when it is not one.
func BackendOf(name string) string {
	l, err := ParseLane(name)
	if err != nil {
		return ""
	}
	return l.Backend
}

// CompareNames orders lane names as Compare orders their ids; names that are not lanes come
// last, by name.
func CompareNames(a, b string) int {
	la, ea := ParseLane(a)
	lb, eb := ParseLane(b)
	switch {
	case ea == nil && eb == nil:
		return la.Compare(lb)
	case ea == nil:
		return -1
	case eb == nil:
		return 1
	}
	return cmp.Compare(a, b)
}

// SortLanes sorts lane names in place (CompareNames).
func SortLanes(names []string) { slices.SortFunc(names, CompareNames) }
