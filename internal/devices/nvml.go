package devices

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// NVML, with our own prototypes (nvml.h is not needed to build). Layouts as in nvml.h.
typedef struct { unsigned long long total, free, used; } fpk_nvml_memory;
typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} fpk_nvml_pci;

typedef struct {
	void *dl;
	int (*init)(void);
	int (*shutdown)(void);
	const char *(*error_string)(int);
	int (*count)(unsigned int *);
	int (*by_index)(unsigned int, void **);
	int (*by_bus)(const char *, void **);
	int (*name)(void *, char *, unsigned int);
	int (*pci)(void *, fpk_nvml_pci *);
	int (*memory)(void *, fpk_nvml_memory *);
	int (*cc)(void *, int *, int *);
	int (*driver)(char *, unsigned int);
} fpk_nvml;

static void *sym2(void *dl, const char *a, const char *b) {
	void *p = dlsym(dl, a);
	return p || !b ? p : dlsym(dl, b);
}

// Opens NVML from path (or the usual sonames) and initialises it; 0 on success, else -1 with
// why filled in (a missing library), or NVML's status.
static int fpk_nvml_open(const char *path, fpk_nvml *n, char *why, size_t whylen) {
	memset(n, 0, sizeof *n);
	if (path && *path) n->dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	else {
		n->dl = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
		if (!n->dl) n->dl = dlopen("libnvidia-ml.so", RTLD_NOW | RTLD_LOCAL);
	}
	if (!n->dl) {
		const char *e = dlerror();
		strncpy(why, e ? e : "dlopen failed", whylen - 1);
		why[whylen - 1] = 0;
		return -1;
	}
	n->init = sym2(n->dl, "nvmlInit_v2", "nvmlInit");
	n->shutdown = sym2(n->dl, "nvmlShutdown", NULL);
	n->error_string = sym2(n->dl, "nvmlErrorString", NULL);
	n->count = sym2(n->dl, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount");
	n->by_index = sym2(n->dl, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex");
	n->by_bus = sym2(n->dl, "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetHandleByPciBusId");
	n->name = sym2(n->dl, "nvmlDeviceGetName", NULL);
	n->pci = sym2(n->dl, "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2");
	n->memory = sym2(n->dl, "nvmlDeviceGetMemoryInfo", NULL);
	n->cc = sym2(n->dl, "nvmlDeviceGetCudaComputeCapability", NULL);
	n->driver = sym2(n->dl, "nvmlSystemGetDriverVersion", NULL);
	if (!n->init || !n->shutdown || !n->count || !n->by_index || !n->by_bus || !n->name || !n->pci ||
	    !n->memory) {
		strncpy(why, "library lacks NVML entry points", whylen - 1);
		why[whylen - 1] = 0;
		dlclose(n->dl);
		n->dl = NULL;
		return -1;
	}
	int st = n->init();
	if (st != 0) {
		dlclose(n->dl);
		n->dl = NULL;
	}
	return st;
}

static void fpk_nvml_close(fpk_nvml *n) {
	if (!n->dl) return;
	n->shutdown();
	dlclose(n->dl);
	n->dl = NULL;
}

static const char *fpk_nvml_error(fpk_nvml *n, int st) {
	return n->error_string ? n->error_string(st) : "nvml error";
}

static int fpk_nvml_count(fpk_nvml *n, unsigned int *c) { return n->count(c); }
static int fpk_nvml_by_index(fpk_nvml *n, unsigned int i, void **d) { return n->by_index(i, d); }
static int fpk_nvml_by_bus(fpk_nvml *n, const char *b, void **d) { return n->by_bus(b, d); }
static int fpk_nvml_name(fpk_nvml *n, void *d, char *s, unsigned int l) { return n->name(d, s, l); }
static int fpk_nvml_pci_info(fpk_nvml *n, void *d, fpk_nvml_pci *p) { return n->pci(d, p); }
static int fpk_nvml_memory_info(fpk_nvml *n, void *d, fpk_nvml_memory *m) { return n->memory(d, m); }
static int fpk_nvml_cc(fpk_nvml *n, void *d, int *a, int *b) { return n->cc ? n->cc(d, a, b) : -1; }
static int fpk_nvml_driver(fpk_nvml *n, char *s, unsigned int l) { return n->driver ? n->driver(s, l) : -1; }
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"unsafe"
)

// NVML status codes we act on.
const (
	nvmlNotFound        = 6
	nvmlDriverNotLoaded = 9
	nvmlLibraryNotFound = 12
)

// nvmlMu serialises NVML sessions of this process (init/shutdown are reference counted by
// NVML, but one session at a time keeps the error paths simple).
var nvmlMu sync.Mutex

// nvmlSession opens NVML, runs f and shuts NVML down.
func nvmlSession(path string, f func(n *C.fpk_nvml) error) error {
	nvmlMu.Lock()
	defer nvmlMu.Unlock()
	var n C.fpk_nvml
	var why [256]C.char
	var cpath *C.char
	if path != "" {
		cpath = C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
	}
	st := C.fpk_nvml_open(cpath, &n, &why[0], C.size_t(len(why)))
	switch {
	case st == -1:
		return fmt.Errorf("nvml: %s: %w", C.GoString(&why[0]), ErrNoDevices)
	case st == nvmlDriverNotLoaded || st == nvmlLibraryNotFound:
		return fmt.Errorf("nvml: init: status %d: %w", int(st), ErrNoDevices)
	case st != 0:
		return fmt.Errorf("nvml: init: status %d", int(st))
	}
	defer C.fpk_nvml_close(&n)
	return f(&n)
}

func nvmlErr(n *C.fpk_nvml, what string, st C.int) error {
	return fmt.Errorf("nvml: %s: %s (%d)", what, C.GoString(C.fpk_nvml_error(n, st)), int(st))
}

func nvmlDevice(n *C.fpk_nvml, h unsafe.Pointer, index int, driver string) (Device, error) {
	var name [96]C.char
	if st := C.fpk_nvml_name(n, h, &name[0], C.uint(len(name))); st != 0 {
		return Device{}, nvmlErr(n, "device name", st)
	}
	var pci C.fpk_nvml_pci
	if st := C.fpk_nvml_pci_info(n, h, &pci); st != 0 {
		return Device{}, nvmlErr(n, "pci info", st)
	}
	var mem C.fpk_nvml_memory
	if st := C.fpk_nvml_memory_info(n, h, &mem); st != 0 {
		return Device{}, nvmlErr(n, "memory info", st)
	}
	d := Device{
		Backend: BackendCUDA, Index: index, Name: C.GoString(&name[0]),
		PCIBusID:   NormalizeBusID(C.GoString(&pci.busId[0])),
		TotalBytes: uint64(mem.total), UsedBytes: uint64(mem.used), Driver: driver,
	}
	var major, minor C.int
	if C.fpk_nvml_cc(n, h, &major, &minor) == 0 {
		d.Arch = fmt.Sprintf("sm_%d%d", int(major), int(minor))
	}
	return d, nil
}

// ListNVML returns the NVIDIA GPUs NVML sees, in NVML's index order (CUDA's with
// CUDA_DEVICE_ORDER=PCI_BUS_ID). No NVML library or no driver is ErrNoDevices.
func ListNVML(ctx context.Context, opts Options) ([]Device, error) {
	var out []Device
	err := nvmlSession(opts.NVMLPath, func(n *C.fpk_nvml) error {
		var count C.uint
		if st := C.fpk_nvml_count(n, &count); st != 0 {
			return nvmlErr(n, "device count", st)
		}
		var drv [96]C.char
		driver := ""
		if C.fpk_nvml_driver(n, &drv[0], C.uint(len(drv))) == 0 {
			driver = C.GoString(&drv[0])
		}
		for i := 0; i < int(count); i++ {
			if err := ctx.Err(); err != nil {
				return err
			}
			var h unsafe.Pointer
			if st := C.fpk_nvml_by_index(n, C.uint(i), &h); st != 0 {
				return nvmlErr(n, fmt.Sprintf("device %d", i), st)
			}
			d, err := nvmlDevice(n, h, i, driver)
			if err != nil {
				return fmt.Errorf("device %d: %w", i, err)
			}
			out = append(out, d)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("nvml: %w", ErrNoDevices)
	}
	return out, nil
}

// nvmlUsed reads the used memory of the GPU at busID.
func nvmlUsed(path, busID string) (uint64, error) {
	var used uint64
	err := nvmlSession(path, func(n *C.fpk_nvml) error {
		cbus := C.CString(busID)
		defer C.free(unsafe.Pointer(cbus))
		var h unsafe.Pointer
		if st := C.fpk_nvml_by_bus(n, cbus, &h); st != 0 {
			if st == nvmlNotFound {
				return fmt.Errorf("nvml: no device at %s: %w", busID, ErrNoDevices)
			}
			return nvmlErr(n, "device "+busID, st)
		}
		var mem C.fpk_nvml_memory
		if st := C.fpk_nvml_memory_info(n, h, &mem); st != 0 {
			return nvmlErr(n, "memory info", st)
		}
		used = uint64(mem.used)
		return nil
	})
	return used, err
}

// nvmlReader reads one NVIDIA GPU's used memory through NVML, found by PCI bus id.
type nvmlReader struct {
	busID, path string
}

func (r *nvmlReader) Used(ctx context.Context) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	if r.busID == "" {
		return 0, errors.New("nvml: device without a bus id")
	}
	return nvmlUsed(r.path, r.busID)
}

func (r *nvmlReader) Name() string { return "nvml " + r.busID }
