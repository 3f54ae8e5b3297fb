package gpuversion

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

typedef int (*fpk_version_fn)(int *);

// fpk_call_version opens lib (RTLD_NOW | RTLD_LOCAL), calls sym(&v) and closes it. It returns
// 0 with *out set on success, -1 when the library or symbol is missing, else the call's status.
static int fpk_call_version(const char *lib, const char *sym, int *out) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h) return -1;
	fpk_version_fn f = (fpk_version_fn)dlsym(h, sym);
	if (!f) { dlclose(h); return -1; }
	int v = 0;
	int st = f(&v);
	dlclose(h);
	if (st != 0) return st;
	*out = v;
	return 0;
}
*/
import "C"

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"unsafe"
)

// The runtime and driver libraries, newest soname first.
var (
	cudartLibs = []string{"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}
	cudaLibs   = []string{"libcuda.so.1", "libcuda.so"}
	hipLibs    = []string{"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"}
)

// callVersion calls sym of the first library of libs that has it.
func callVersion(libs []string, sym string) (v int, lib string, err error) {
	csym := C.CString(sym)
	defer C.free(unsafe.Pointer(csym))
	for _, l := range libs {
		cl := C.CString(l)
		var out C.int
		st := C.fpk_call_version(cl, csym, &out)
		C.free(unsafe.Pointer(cl))
		switch {
		case st == 0:
			return int(out), l, nil
		case st > 0:
			return 0, l, fmt.Errorf("%s %s: status %d", l, sym, int(st))
		}
	}
	return 0, "", fmt.Errorf("%s: none of %s opens", sym, strings.Join(libs, ", "))
}

// Options configure Read; the zero value reads this machine.
type Options struct {
	// SysRoot is prepended to /sys paths (tests); "" is "/".
	SysRoot string
	// Getenv reads EnvFake; nil means os.Getenv.
	Getenv func(string) string
}

// Read returns the versions of backend ("cuda" or "hip") in this process; ok is false for
// another backend. A version that cannot be read stays unknown and its source says why.
// When EnvFake is set (tests), its pair is returned instead, whatever the backend.
func Read(backend string, opts Options) (v Versions, ok bool, err error) {
	getenv := opts.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	if fake := getenv(EnvFake); fake != "" {
		v, err := parseFake(fake)
		return v, err == nil, err
	}
	switch backend {
	case "cuda":
		return readCUDA(), true, nil
	case "hip":
		return readHIP(opts.SysRoot), true, nil
	}
	return Versions{}, false, nil
}

// parseFake reads EnvFake's "<backend>:<runtime>/<driver>".
func parseFake(s string) (Versions, error) {
	backend, pair, ok := strings.Cut(s, ":")
	rt, drv, ok2 := strings.Cut(pair, "/")
	if !ok || !ok2 || (backend != "cuda" && backend != "hip") {
		return Versions{}, fmt.Errorf("%s=%q: want <cuda|hip>:<runtime>/<driver>", EnvFake, s)
	}
	r, err := Parse(rt)
	if err != nil {
		return Versions{}, fmt.Errorf("%s: runtime: %w", EnvFake, err)
	}
	d, err := Parse(drv)
	if err != nil {
		return Versions{}, fmt.Errorf("%s: driver: %w", EnvFake, err)
	}
	return Versions{Backend: backend, Runtime: r, Driver: d, RuntimeSource: EnvFake, DriverSource: EnvFake}, nil
}

// readCUDA reads cudaRuntimeGetVersion and cudaDriverGetVersion from libcudart, the driver's
// from libcuda's cuDriverGetVersion when libcudart is missing.
func readCUDA() Versions {
	v := Versions{Backend: "cuda"}
	if n, lib, err := callVersion(cudartLibs, "cudaRuntimeGetVersion"); err == nil {
		v.Runtime, v.RuntimeSource = FromCUDA(n), lib+" cudaRuntimeGetVersion"
	} else {
		v.RuntimeSource = err.Error()
	}
	if n, lib, err := callVersion(cudartLibs, "cudaDriverGetVersion"); err == nil && n > 0 {
		v.Driver, v.DriverSource = FromCUDA(n), lib+" cudaDriverGetVersion"
	} else if n, lib, err := callVersion(cudaLibs, "cuDriverGetVersion"); err == nil {
		v.Driver, v.DriverSource = FromCUDA(n), lib+" cuDriverGetVersion"
	} else {
		v.DriverSource = err.Error()
	}
	return v
}

// readHIP reads hipRuntimeGetVersion from libamdhip64 and the host amdgpu driver's ROCm
// release from its DKMS module version; an in-kernel amdgpu (no module version) is unknown.
func readHIP(sysRoot string) Versions {
	v := Versions{Backend: "hip"}
	if n, lib, err := callVersion(hipLibs, "hipRuntimeGetVersion"); err == nil {
		v.Runtime, v.RuntimeSource = FromHIP(n), lib+" hipRuntimeGetVersion"
	} else {
		v.RuntimeSource = err.Error()
	}
	drv := "hipDriverGetVersion unread"
	if n, _, err := callVersion(hipLibs, "hipDriverGetVersion"); err == nil {
		drv = "hipDriverGetVersion " + FromHIP(n).String()
	}
	v.Driver, v.DriverSource = AMDGPUDriver(sysRoot)
	v.DriverSource += "; " + drv
	return v
}

// AMDGPUDriver returns the ROCm release of the host's amdgpu kernel driver, from
// /sys/module/amdgpu/version (present with AMD's DKMS driver), and where it came from.
func AMDGPUDriver(sysRoot string) (Version, string) {
	p := filepath.Join(sysRoot, "/sys/module/amdgpu/version")
	b, err := os.ReadFile(p)
	if err != nil {
		return Version{}, "no amdgpu DKMS version (" + p + "): in-kernel driver, release unknown"
	}
	raw := strings.TrimSpace(string(b))
	num := raw
	if i := strings.IndexAny(num, "-+ _"); i > 0 { // "6.8.5-2041575.22.04"
		num = num[:i]
	}
	m, err := Parse(num)
	if err != nil {
		return Version{}, fmt.Sprintf("%s %q: %v", p, raw, err)
	}
	r := ROCmOfAMDGPU(m)
	if !r.Known() {
		return Version{}, fmt.Sprintf("%s %s: not a ROCm release this build knows", p, raw)
	}
	return r, fmt.Sprintf("%s %s = ROCm %s", p, raw, r)
}
