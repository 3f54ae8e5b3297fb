// Package devices finds the machine's GPUs and reads their memory figures as the drivers report
// them: NVML on NVIDIA (libnvidia-ml, dlopened with our own prototypes, so nothing vendor-specific
// is needed to build), amdgpu's sysfs on AMD (the kfd topology for the architecture, the PCI
// device's mem_info_vram_* and, for APUs with unified memory such as gfx1151, mem_info_gtt_*).
// Devices are matched across sources by PCI bus id, never by index.
//
// Discovery loads driver libraries, so the supervisor runs it in a throwaway child process (the
// probe worker calls List); the VRAM recovery check of the watchdog polls a Reader (UsedBytes).
package devices

import (
	"context"
	"errors"
	"fmt"
	"strings"
)

// Backends names.
const (
	BackendCUDA = "cuda"
	BackendHIP  = "hip"
)

// ErrNoDevices means the backend's driver answered but has no device, or is not there at all.
var ErrNoDevices = errors.New("no devices")

// Device is one GPU as its driver describes it.
type Device struct {
	Backend  string // "cuda" or "hip"
	Index    int    // the backend's device index (CUDA / HIP order)
	Name     string // marketing name ("NVIDIA H100 80GB HBM3", "AMD Radeon RX 6800 XT")
	Arch     string // "sm_90", "gfx1030"
	PCIBusID string // "0000:03:00.0", lower case, domain included

	// TotalBytes and UsedBytes are the memory a model can use and what is in use now: VRAM on
	// dedicated cards; VRAM plus GTT on APUs with unified memory (Unified).
	TotalBytes, UsedBytes uint64
	// VRAM and GTT figures as amdgpu reports them (0 on NVIDIA).
	VRAMTotal, VRAMUsed, GTTTotal, GTTUsed uint64
	// Unified is set for APUs whose GPU allocates from system memory (gfx1151 and the like).
	Unified bool
	// Driver is the driver version where known ("580.159.04", amdgpu's kernel module version).
	Driver string
}

// FreeBytes is TotalBytes − UsedBytes (0 when used exceeds total).
func (d Device) FreeBytes() uint64 {
	if d.UsedBytes >= d.TotalBytes {
		return 0
	}
	return d.TotalBytes - d.UsedBytes
}

// Reader reads one device's used memory now. It has the method set of the watchdog's Memory,
// so the VRAM recovery check can poll it directly.
type Reader interface {
	// Used returns the bytes in use on the device now.
	Used(ctx context.Context) (uint64, error)
	// Name says where the figure comes from ("nvml 0000:3b:00.0", "amdgpu sysfs …").
	Name() string
}

// Options configure List and NewReader; the zero value reads the real machine.
type Options struct {
	// SysRoot is prepended to /sys paths (tests point it at a fake tree); "" is "/".
	SysRoot string
	// NVMLPath is the NVML library to open; "" tries libnvidia-ml.so.1 then libnvidia-ml.so.
	NVMLPath string
}

// List returns the devices of backend ("cuda", "hip", or "auto"/"" for both, NVIDIA first).
// With "auto", a vendor whose driver is missing is skipped; ErrNoDevices when none is found.
func List(ctx context.Context, backend string, opts Options) ([]Device, error) {
	var out []Device
	var errs []error
	if backend == BackendCUDA || backend == "" || backend == "auto" {
		devs, err := ListNVML(ctx, opts)
		out = append(out, devs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	if backend == BackendHIP || backend == "" || backend == "auto" {
		devs, err := ListAMD(ctx, opts)
		out = append(out, devs...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	switch backend {
	case BackendCUDA, BackendHIP, "", "auto":
	default:
		return nil, fmt.Errorf("list devices: unknown backend %q", backend)
	}
	if len(out) == 0 {
		if len(errs) == 0 {
			errs = append(errs, ErrNoDevices)
		}
		return nil, fmt.Errorf("list %s devices: %w", backendLabel(backend), errors.Join(errs...))
	}
	return out, nil
}

func backendLabel(b string) string {
	if b == "" {
		return "auto"
	}
	return b
}

// NewReader returns the used-memory reader of dev (NVML by bus id on cuda, sysfs on hip).
func NewReader(dev Device, opts Options) (Reader, error) {
	switch dev.Backend {
	case BackendCUDA:
		return &nvmlReader{busID: dev.PCIBusID, path: opts.NVMLPath}, nil
	case BackendHIP:
		return &amdReader{root: opts.SysRoot, busID: dev.PCIBusID, unified: dev.Unified}, nil
	}
	return nil, fmt.Errorf("device reader: backend %q has no memory figures", dev.Backend)
}

// UsedBytes reads dev's used memory now (the figure the watchdog compares to its baseline).
func UsedBytes(ctx context.Context, dev Device, opts Options) (uint64, error) {
	r, err := NewReader(dev, opts)
	if err != nil {
		return 0, err
	}
	return r.Used(ctx)
}

// NormalizeBusID writes a PCI address as sysfs does: lower case, with a 4-digit domain
// ("00000000:3B:00.0" from NVML → "0000:3b:00.0").
func NormalizeBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok {
		return s
	}
	if strings.Count(rest, ":") == 0 { // "03:00.0" without a domain
		return "0000:" + s
	}
	dom = strings.TrimLeft(dom, "0")
	for len(dom) < 4 {
		dom = "0" + dom
	}
	return dom + ":" + rest
}
