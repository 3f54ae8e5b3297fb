// Package gpuversion reads the GPU runtime a process links (the container's CUDA or ROCm) and
// the version the host's driver serves, and says when the pair cannot work: a runtime newer
// than the driver serves, or a pairing known to crash (ROCm 6.4 user space on a ROCm 6.1
// amdgpu driver crashed in cleanup at 1024², issue 22). The daemon holds a lane with such a
// pair instead of letting its first job crash.
//
// Versions are read with dlopen and our own prototypes (libcudart/libcuda, libamdhip64) and
// from amdgpu's sysfs module version, so nothing vendor-specific is needed to build. Tests fake
// a pair with EnvFake, read by Read in the probe worker.
package gpuversion

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/framepackd/framepackd/internal/envconfig"
)

// EnvFake names the environment variable that fakes the versions Read returns, for tests
// only: "<backend>:<runtime>/<driver>", e.g. "hip:6.4.1/6.1" or "cuda:12.8/12.4".
var EnvFake = envconfig.FakeGPUVersions.Name

// Version is a major.minor[.patch] version; the zero value is unknown.
type Version struct{ Major, Minor, Patch int }

// Known reports whether the version was read.
func (v Version) Known() bool { return v != Version{} }

// String prints "12.4" or "6.4.1" ("" when unknown).
func (v Version) String() string {
	if !v.Known() {
		return ""
	}
	if v.Patch > 0 {
		return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	}
	return fmt.Sprintf("%d.%d", v.Major, v.Minor)
}

// Release returns major.minor only (what compatibility is judged on).
func (v Version) Release() Version { return Version{Major: v.Major, Minor: v.Minor} }

// Compare returns -1, 0 or 1 as v's release is older, the same or newer than w's (patch
// levels are ignored).
func (v Version) Compare(w Version) int {
	switch {
	case v.Major != w.Major:
		return cmpInt(v.Major, w.Major)
	default:
		return cmpInt(v.Minor, w.Minor)
	}
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Parse reads "12", "12.4" or "6.4.1" (leading "v" allowed).
func Parse(s string) (Version, error) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	parts := strings.Split(s, ".")
	if s == "" || len(parts) > 3 {
		return Version{}, fmt.Errorf("version %q: want major.minor[.patch]", s)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 0 {
			return Version{}, fmt.Errorf("version %q: %q is not a number", s, p)
		}
		n[i] = v
	}
	return Version{n[0], n[1], n[2]}, nil
}

// FromCUDA decodes CUDA's integer version (1000·major + 10·minor: 12040 is 12.4).
func FromCUDA(v int) Version {
	if v <= 0 {
		return Version{}
	}
	return Version{Major: v / 1000, Minor: (v % 1000) / 10}
}

// FromHIP decodes HIP's integer version (10⁷·major + 10⁵·minor + patch: 60443484 is
// 6.4.43484).
func FromHIP(v int) Version {
	if v <= 0 {
		return Version{}
	}
	return Version{Major: v / 10_000_000, Minor: (v / 100_000) % 100, Patch: v % 100_000}
}

// Versions is what Read found for one backend.
type Versions struct {
	// Backend is "cuda" or "hip".
	Backend string
	// Runtime is the runtime's version (the container's CUDA or ROCm).
	Runtime Version
	// Driver is the newest runtime release the host driver serves: CUDA's driver version, or
	// the ROCm release of the host's amdgpu kernel driver.
	Driver Version
	// RuntimeSource and DriverSource say where each was read.
	RuntimeSource, DriverSource string
}

// amdgpuReleases maps the amdgpu DKMS module version (/sys/module/amdgpu/version) of each ROCm
// release to that release, from AMD's release notes: ROCm 6.0 ships amdgpu 6.3.6, 6.1 ships
// 6.7.0, 6.2 ships 6.8.5, 6.3 ships 6.10.5, 6.4 ships 6.12.12. A module version between two
// entries belongs to the older one.
var amdgpuReleases = []struct{ module, rocm Version }{
	{Version{6, 3, 6}, Version{6, 0, 0}},
	{Version{6, 7, 0}, Version{6, 1, 0}},
	{Version{6, 8, 5}, Version{6, 2, 0}},
	{Version{6, 10, 5}, Version{6, 3, 0}},
	{Version{6, 12, 12}, Version{6, 4, 0}},
}

// ROCmOfAMDGPU returns the ROCm release whose amdgpu DKMS driver has module version m; unknown
// for versions older than ROCm 6.0's or past the table (a newer driver than this build knows
// serves every runtime it knows, so nothing is lost).
func ROCmOfAMDGPU(m Version) Version {
	var out Version
	for _, e := range amdgpuReleases {
		if m.Compare(e.module) >= 0 {
			out = e.rocm
		}
	}
	if m.Compare(amdgpuReleases[len(amdgpuReleases)-1].module) > 0 {
		return Version{}
	}
	return out
}
