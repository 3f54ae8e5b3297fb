// Package runtime is the Go face of framepackd's native tensor runtime (native/, C ABI in
// native/include/fpk.h): tensors in backend memory, the ops the four models need, a memory cap
// that fails with a typed out-of-memory error, and the convolution fallback chain with its
// shared decision cache (package convcache).
//
// One Runtime is one backend instance (cpu, or cuda/hip from their dlopened libraries) with its own
// memory accounting; a worker process opens one at Load. Tensors are created by the runtime,
// moved with Upload/Download, and freed with Free (or a Scope). Every op allocates and returns
// a new tensor; inputs are never modified.
//
//	rt, err := runtime.New(runtime.Options{MemoryCap: 20 << 30})
//	defer rt.Close()
//	var sc runtime.Scope
//	defer sc.Free()
//	h, err := sc.Track(rt.Conv3d(x, w, b, runtime.Conv3dParams{Padding: [3]int{1, 1, 1}}))
//	h, err = sc.Track(rt.SiLU(h))
package runtime

/*
#include <stdlib.h>
#include "fpk.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/envconfig"
)

// Options configure a Runtime. The zero value is a cpu backend on every core without a cap.
type Options struct {
	// Backend names the backend: "cpu" (built in), the name of a backend library ("cuda",
	// "hip"), opened from LibraryPath or BackendDir/libfpk-<Backend>.so, or "auto": cuda, then
	// hip, then cpu, the first that opens. "" means envconfig.Backend's value, or "cpu" when
	// unset.
	Backend string
	// LibraryPath is the backend library to open (overrides BackendDir).
	LibraryPath string
	// BackendDir holds backend libraries; "" means envconfig.NativeDir's value, or the
	// directory of the executable when unset.
	BackendDir string
	// Device is the device index on the backend (0 for cpu).
	Device int
	// PCIBusID, when set, opens the GPU with this PCI bus id ("0000:65:00.0") instead of
	// Device; ignored on cpu.
	PCIBusID string
	// FindDB is the cuDNN find database the cuda backend keeps its Find choices in, shared by
	// the workers (fpk_backend_config.find_db_path); "" keeps them in this process.
	FindDB string
	// Threads is the number of threads for the cpu backend's loops and BLAS (0 = every core).
	Threads int
	// MemoryCap is the most bytes the runtime may hold at once (tensors and scratch); 0 means
	// no cap. Going over fails with *OOMError.
	MemoryCap int64
	// CacheLimit bounds the freed blocks the allocator keeps for reuse (within the cap);
	// 0 means min(1 GiB, MemoryCap/4) on cpu and, on device backends (where cudaMalloc and
	// cudaFree cost milliseconds and synchronise), everything freed, within the cap (a device
	// allocation that fails gives the cache back and retries).
	CacheLimit int64
	// Poison fills every new tensor with NaN so elements an op fails to write show up (tests).
	Poison bool

	// ConvCache is the shared conv decision cache; nil keeps decisions in this process only.
	ConvCache *convcache.Cache
	// ConvPolicy adjusts the conv fallback chain.
	ConvPolicy ConvPolicy
	// AttentionTier forces one attention tier for every Attention (AttentionAuto, the zero
	// value, runs the chain; the test knob envconfig.AttentionTier sets it when zero).
	AttentionTier AttentionTier
	// ConvFaults inject failures and hangs into chosen conv tiers and shapes (tests).
	ConvFaults []ConvFault
	// OpObserver is told of every op's start and end (the worker's beacon).
	OpObserver OpObserver
	// OpFault is a test hook called before every op, after OpObserver's begin event, with the
	// same event: a non-nil error fails the op without running it (as *OpFaultError wrapping
	// the error; OOMAtOp makes one that injects a typed out of memory). Workers route their
	// oom_at_op fault through it. It must be fast and must not call back into the runtime.
	OpFault func(OpEvent) error

	// ShapeOnly opens a shape-only runtime (native fpk_backend_new_shape) instead of a backend:
	// its tensors have a shape and a dtype and no memory, uploads and downloads move nothing, its
	// ops check their operands and allocate their outputs and compute nothing, and its memory
	// accounting (MemoryCap, Memory's Peak) counts every tensor, and the scratch the convs and
	// attention of the backend Backend names ("cpu", "cuda", "hip": ScratchPolicy) would take,
	// as that backend's would. A model's forward run on it measures what the forward holds at a
	// shape. Device, PCIBusID, FindDB, Threads and Poison are ignored.
	ShapeOnly bool

	// hostBounce makes the cpu backend refuse its own conv tier so the core's host round trip
	// serves the CPU tier, as it will on a GPU backend (tests).
	hostBounce bool
}

// Runtime is one native backend instance with its memory accounting and conv chain. Its
// methods are safe for concurrent use; ops from several goroutines run one after another where
// they share the backend's thread pool.
type Runtime struct {
	be     C.fpk_backend_t
	stream C.fpk_stream_t
	opts   Options
	info   BackendInfo

	seq  atomic.Uint64
	attn attentionCounters
	fp8  fp8State
	cur  atomic.Pointer[CurrentOp]
	prof atomic.Pointer[func(OpTime)] // set while Profile runs

	chain *convChain

	// mu protects closed.
	mu     sync.RWMutex
	closed bool
}

// BackendInfo describes the backend a Runtime runs on.
type BackendInfo struct {
	Name         string // "cpu"
	DeviceName   string // CPU model or GPU name
	Device       int
	APIVersion   int
	IsHost       bool   // tensors are host memory
	Threads      int    // threads of the cpu backend
	ConvTiers    []Tier // tiers the backend itself has, in chain order
	DeviceMemory uint64 // total device memory in bytes (0 if unknown)
}

// MemoryStats is the runtime allocator's accounting.
type MemoryStats struct {
	Cap       uint64 // 0 = no cap
	Allocated uint64 // bytes held now (tensors and scratch; blocks of 1 MiB and more are
	// charged rounded up to 64 KiB)
	Cached      uint64 // freed blocks kept for reuse; Allocated + Cached never exceeds Cap
	Peak        uint64 // most bytes held at once
	Allocs      uint64 // allocations so far
	LiveTensors uint64 // tensor handles not yet freed
}

// Stats is what a worker reports about its runtime.
type Stats struct {
	Backend BackendInfo
	Memory  MemoryStats
	Conv    ConvStats
	Ops     uint64 // ops run so far
}

// Environment variables that set defaults of Options (internal/envconfig declares them: tests
// and benchmarks on a GPU machine run the same binaries with its Backend set to cuda).
var (
	// EnvBackend is the backend when Options.Backend is "" ("cpu", "cuda", "hip", "auto").
	EnvBackend = envconfig.Backend.Name
	// EnvNativeDir is the directory of backend libraries when Options.BackendDir is "".
	EnvNativeDir = envconfig.NativeDir.Name
	// EnvConvTier forces one conv tier ("vendor_tuned", "vendor_default", "own_kernel", "cpu")
	// when Options.ConvPolicy is the zero value: only that tier is tried (tests of each tier).
	EnvConvTier = envconfig.ConvTier.Name
)

// New opens a backend.
func New(opts Options) (*Runtime, error) {
	if opts.Backend == "" {
		opts.Backend = envconfig.Backend.Get()
	}
	if opts.Backend == "" {
		opts.Backend = "cpu"
	}
	if opts.ConvPolicy.isZero() {
		if v := envconfig.ConvTier.Get(); v != "" {
			t, err := ParseTier(v)
			if err != nil {
				return nil, argError("new runtime", "%s: %v", EnvConvTier, err)
			}
			opts.ConvPolicy = ConvPolicy{FirstTier: t, Only: true}
		}
	}
	if opts.AttentionTier == AttentionAuto {
		if v := envconfig.AttentionTier.Get(); v != "" {
			t, err := ParseAttentionTier(v)
			if err != nil {
				return nil, argError("new runtime", "%s: %v", EnvAttentionTier, err)
			}
			opts.AttentionTier = t
		}
	}
	if opts.AttentionTier < 0 || int(opts.AttentionTier) >= NumAttentionTiers {
		return nil, argError("new runtime", "attention tier %d out of range", int(opts.AttentionTier))
	}
	if opts.Backend == "auto" && !opts.ShapeOnly {
		return newAuto(opts)
	}
	if opts.MemoryCap < 0 || opts.CacheLimit < 0 || opts.Threads < 0 || opts.Device < 0 {
		return nil, argError("new runtime", "negative memory cap, cache limit, threads or device")
	}
	if err := opts.ConvPolicy.validate(); err != nil {
		return nil, argError("new runtime", "conv policy: %v", err)
	}
	opts.ConvPolicy.TierOverrides = maps.Clone(opts.ConvPolicy.TierOverrides) // the caller may change its map
	for i, f := range opts.ConvFaults {
		if err := f.validate(); err != nil {
			return nil, fmt.Errorf("new runtime: conv fault %d: %w", i, err)
		}
	}
	cfg := C.fpk_backend_config{
		device:      C.int(opts.Device),
		threads:     C.int(opts.Threads),
		memory_cap:  C.uint64_t(opts.MemoryCap),
		cache_limit: C.uint64_t(opts.CacheLimit),
	}
	if len(opts.PCIBusID) >= len(cfg.pci_bus_id) || strings.ContainsRune(opts.PCIBusID, 0) {
		return nil, argError("new runtime", "pci bus id %q", opts.PCIBusID)
	}
	for i := range len(opts.PCIBusID) {
		cfg.pci_bus_id[i] = C.char(opts.PCIBusID[i])
	}
	if len(opts.FindDB) >= len(cfg.find_db_path) || strings.ContainsRune(opts.FindDB, 0) {
		return nil, argError("new runtime", "find database path %q: at most %d bytes", opts.FindDB, len(cfg.find_db_path)-1)
	}
	for i := range len(opts.FindDB) {
		cfg.find_db_path[i] = C.char(opts.FindDB[i])
	}
	if opts.Poison {
		cfg.flags |= C.FPK_BACKEND_FLAG_POISON
	}
	if opts.CacheLimit == 0 && opts.Backend != "cpu" {
		cfg.cache_limit = 1 << 50
	}
	if opts.hostBounce {
		cfg.flags |= C.FPK_BACKEND_FLAG_TEST_HOST_BOUNCE
	}
	rt := &Runtime{opts: opts}
	switch {
	case opts.ShapeOnly:
		cfg.flags &^= C.FPK_BACKEND_FLAG_POISON
		pol := ScratchPolicy(opts.Backend).c()
		if err := call("new shape-only runtime", func() C.fpk_status { return C.fpk_backend_new_shape(&cfg, &pol, &rt.be) }); err != nil {
			return nil, err
		}
	case opts.Backend == "cpu":
		if err := call("new runtime", func() C.fpk_status { return C.fpk_backend_new_cpu(&cfg, &rt.be) }); err != nil {
			return nil, err
		}
	default:
		path, err := libraryPath(opts)
		if err != nil {
			return nil, err
		}
		cpath := C.CString(path)
		defer C.free(unsafe.Pointer(cpath))
		if err := call("open backend "+opts.Backend, func() C.fpk_status { return C.fpk_backend_open(cpath, &cfg, &rt.be) }); err != nil {
			return nil, err
		}
	}
	rt.stream = C.fpk_backend_get_default_stream(rt.be)
	var props C.fpk_backend_props
	if err := call("new runtime", func() C.fpk_status { return C.fpk_backend_get_props(rt.be, &props) }); err != nil {
		C.fpk_backend_free(rt.be)
		return nil, err
	}
	rt.info = BackendInfo{
		Name:         C.GoString(&props.name[0]),
		DeviceName:   C.GoString(&props.device_name[0]),
		Device:       int(props.device),
		APIVersion:   int(props.api_version),
		IsHost:       props.is_host != 0,
		Threads:      int(props.threads),
		DeviceMemory: uint64(props.device_memory),
	}
	for t := Tier(0); t < NumTiers; t++ {
		if uint32(props.conv_tiers)&(1<<uint(t)) != 0 {
			rt.info.ConvTiers = append(rt.info.ConvTiers, t)
		}
	}
	rt.chain = newConvChain(rt, uint32(props.conv_tiers))
	return rt, nil
}

// AutoBackends are the backends "auto" tries, in order.
var AutoBackends = []string{"cuda", "hip", "cpu"}

// newAuto opens the first of AutoBackends that opens: a missing library or a machine without
// that vendor's device falls through to the next (the errors are joined when none opens).
func newAuto(opts Options) (*Runtime, error) {
	var errs []error
	for _, name := range AutoBackends {
		o := opts
		o.Backend = name
		if name != "cpu" {
			o.LibraryPath = ""
		}
		rt, err := New(o)
		if err == nil {
			return rt, nil
		}
		errs = append(errs, err)
		if errors.Is(err, ErrInvalidArgument) {
			break
		}
	}
	return nil, fmt.Errorf("new runtime: auto: %w", errors.Join(errs...))
}

// libraryPath finds the shared library of a non-cpu backend.
func libraryPath(opts Options) (string, error) {
	if opts.LibraryPath != "" {
		return opts.LibraryPath, nil
	}
	if strings.ContainsAny(opts.Backend, "/\\ ") {
		return "", argError("new runtime", "bad backend name %q", opts.Backend)
	}
	dir := opts.BackendDir
	if dir == "" {
		dir = envconfig.NativeDir.Get()
	}
	if dir == "" {
		exe, err := os.Executable()
		if err != nil {
			return "", fmt.Errorf("new runtime: find backend dir: %w", err)
		}
		dir = filepath.Dir(exe)
	}
	return filepath.Join(dir, "libfpk-"+opts.Backend+".so"), nil
}

// Close frees the backend. Every tensor must have been freed first: Close reports the number
// still alive as an error (and then frees nothing, so their handles stay valid).
func (rt *Runtime) Close() error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.closed {
		return nil
	}
	if err := call("close runtime", func() C.fpk_status { return C.fpk_backend_free(rt.be) }); err != nil {
		return err
	}
	rt.closed = true
	rt.be = nil
	rt.stream = nil
	return nil
}

// Backend describes the backend.
func (rt *Runtime) Backend() BackendInfo {
	info := rt.info
	info.ConvTiers = append([]Tier(nil), rt.info.ConvTiers...)
	return info
}

// Memory returns the allocator's accounting.
func (rt *Runtime) Memory() MemoryStats {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	if rt.closed {
		return MemoryStats{}
	}
	var m C.fpk_memory_stats
	C.fpk_backend_get_memory(rt.be, &m)
	return MemoryStats{Cap: uint64(m.cap), Allocated: uint64(m.allocated), Cached: uint64(m.cached),
		Peak: uint64(m.peak), Allocs: uint64(m.allocs), LiveTensors: uint64(m.live_tensors)}
}

// PinHost registers host memory with the device (page-locked) so uploads from it and
// downloads into it run at DMA speed: the weights' mmapped shared segments on a GPU backend.
// A no-op on cpu. Call UnpinHost before the memory is unmapped.
func (rt *Runtime) PinHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return rt.withBackend("pin host memory", func() C.fpk_status {
		return C.fpk_backend_host_register(rt.be, unsafe.Pointer(&b[0]), C.size_t(len(b)))
	})
}

// UnpinHost undoes PinHost.
func (rt *Runtime) UnpinHost(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	return rt.withBackend("unpin host memory", func() C.fpk_status {
		return C.fpk_backend_host_unregister(rt.be, unsafe.Pointer(&b[0]))
	})
}

// DeviceMemory returns the device's free and total memory as the driver reports them
// (cudaMemGetInfo / hipMemGetInfo): the whole device, not this runtime's share. ErrUnsupported
// on cpu.
func (rt *Runtime) DeviceMemory() (free, total uint64, err error) {
	var f, tt C.uint64_t
	err = rt.withBackend("device memory", func() C.fpk_status { return C.fpk_backend_get_device_memory(rt.be, &f, &tt) })
	return uint64(f), uint64(tt), err
}

// TrimCache gives the allocator's cached free blocks back to the system (or the device).
func (rt *Runtime) TrimCache() error {
	return rt.withBackend("trim cache", func() C.fpk_status { return C.fpk_backend_trim(rt.be) })
}

// SetMemoryCap changes the cap (0 = none). Lowering it below what is held makes the next
// allocation fail.
func (rt *Runtime) SetMemoryCap(bytes int64) error {
	if bytes < 0 {
		return argError("set memory cap", "negative cap %d", bytes)
	}
	return rt.withBackend("set memory cap", func() C.fpk_status {
		return C.fpk_backend_set_memory_cap(rt.be, C.uint64_t(bytes))
	})
}

// ResetPeak sets the memory peak to what is allocated now.
func (rt *Runtime) ResetPeak() error {
	return rt.withBackend("reset peak", func() C.fpk_status { return C.fpk_backend_reset_peak(rt.be) })
}

// Stats returns the backend, memory, conv chain and op counts.
func (rt *Runtime) Stats() Stats {
	return Stats{Backend: rt.Backend(), Memory: rt.Memory(), Conv: rt.chain.stats(), Ops: rt.seq.Load()}
}

// ConvStats returns the conv fallback chain's statistics.
func (rt *Runtime) ConvStats() ConvStats { return rt.chain.stats() }

// CurrentOp returns the op the runtime is in now (ok false between ops).
func (rt *Runtime) CurrentOp() (CurrentOp, bool) {
	c := rt.cur.Load()
	if c == nil {
		return CurrentOp{}, false
	}
	return *c, true
}

// Synchronize waits for every queued operation (a no-op on cpu, where ops are synchronous).
func (rt *Runtime) Synchronize() error {
	return rt.withBackend("synchronize", func() C.fpk_status { return C.fpk_stream_synchronize(rt.stream) })
}

func (rt *Runtime) withBackend(op string, f func() C.fpk_status) error {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	if rt.closed {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	return call(op, f)
}

// run runs one op into out (already allocated; nil for ops without an output): observer begin,
// the fault hook, the native call, observer end.
func (rt *Runtime) run(op string, out *Tensor, f func() C.fpk_status) error {
	rt.mu.RLock()
	defer rt.mu.RUnlock()
	if rt.closed {
		return fmt.Errorf("%s: %w", op, ErrClosed)
	}
	return rt.observe(op, "", 0, out, func() error { return call(op, f) })
}

// observe brackets f with op events and the current-op field, and fails the op without running
// f when Options.OpFault says so. key and tier are for conv tier attempts. The caller holds
// rt.mu (read) and the runtime is open.
func (rt *Runtime) observe(op, key string, tier Tier, out *Tensor, f func() error) error {
	var outBytes uint64
	if out != nil {
		outBytes = uint64(out.NumBytes())
	}
	cur := &CurrentOp{Seq: rt.seq.Add(1), Op: op, Key: key, Tier: tier, Start: time.Now()}
	rt.cur.Store(cur)
	obs, fault := rt.opts.OpObserver, rt.opts.OpFault
	ev := OpEvent{Seq: cur.Seq, Phase: OpBegin, Op: op, Key: key, Tier: tier, Start: cur.Start, OutBytes: outBytes}
	if obs != nil || fault != nil {
		ev.Bytes, ev.Cap = rt.memNow()
	}
	if obs != nil {
		obs(ev)
	}
	var err error
	if fault != nil {
		if ferr := fault(ev); ferr != nil {
			err = &OpFaultError{Op: op, Seq: cur.Seq, Err: ferr}
		}
	}
	if err == nil {
		err = f()
	}
	if prof := rt.prof.Load(); prof != nil {
		rt.profiled(*prof, op, tier, out, cur.Start, err)
	}
	rt.cur.CompareAndSwap(cur, nil)
	if obs != nil {
		ev.Phase, ev.Err = OpEnd, err
		ev.Bytes, ev.Cap = rt.memNow()
		obs(ev)
	}
	return err
}

// memNow returns the allocator's bytes held now and its cap (caller holds rt.mu, runtime open).
func (rt *Runtime) memNow() (allocated, cap uint64) {
	var m C.fpk_memory_stats
	C.fpk_backend_get_memory(rt.be, &m)
	return uint64(m.allocated), uint64(m.cap)
}

// isOOM reports whether err is an out-of-memory error.
func isOOM(err error) bool { return errors.Is(err, ErrOutOfMemory) }
