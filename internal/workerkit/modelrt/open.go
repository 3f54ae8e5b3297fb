package modelrt

import (
	"fmt"
	"math"
	"os"

	"github.com/framepackd/framepackd/internal/faults"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// Open is where every model worker's Load starts, the one path from a LoadRequest to a
// runtime. It checks the request's backend, device and dtype names; sets the vendor
// libraries' environment (LoadRequest.env); and opens the runtime on the device the request
// names: "cpu", "cuda" and "hip" as named, "auto" the first of cuda, hip and cpu that opens, ""
// the runtime's default (the test knob envconfig.Backend, cpu when unset), at req.DeviceIndex
// or, when req.PCIBusID is set, the GPU at that PCI address. The runtime has the memory cap,
// for Config.Conv the conv policy, decision cache, vendor Find database beside the cache
// (FindDB) and hang faults, and the op observer and fault hook. Errors that are the request's
// are invalid arguments.
func (b *Base) Open(req *workerkit.LoadRequest) (*runtime.Runtime, error) {
	opts, err := runtimeOptions(req)
	if err != nil {
		return nil, err
	}
	if err := CheckDTypes(req); err != nil {
		return nil, err
	}
	if err := applyEnv(req.Env); err != nil {
		return nil, err
	}
	return b.newRuntime(req, opts)
}

// runtimeOptions returns the runtime options for req's backend and device; any backend but
// "", "auto", "cpu", "cuda" and "hip" is an invalid argument.
func runtimeOptions(req *workerkit.LoadRequest) (runtime.Options, error) {
	switch req.Backend {
	case "", "auto", "cpu", "cuda", "hip":
	default:
		return runtime.Options{}, workerkit.InvalidArgumentf("backend %q (cpu, cuda, hip or auto)", req.Backend)
	}
	if req.DeviceIndex > math.MaxInt32 {
		return runtime.Options{}, workerkit.InvalidArgumentf("device index %d", req.DeviceIndex)
	}
	return runtime.Options{Backend: req.Backend, Device: int(req.DeviceIndex), PCIBusID: req.PCIBusID}, nil
}

// applyEnv sets LoadRequest.env in the process's environment, before the runtime starts.
func applyEnv(env map[string]string) error {
	for k, v := range env {
		if err := os.Setenv(k, v); err != nil {
			return workerkit.InvalidArgumentf("env %s: %v", k, err)
		}
	}
	return nil
}

// cudnnFindDBSuffix is appended to the conv decision cache's path for the find database.
const cudnnFindDBSuffix = ".cudnn-find"

// FindDB returns the cuDNN find database a worker that convolves keeps its Find results in
// (runtime.Options.FindDB, the backend's config): the request's conv decision cache +
// ".cudnn-find", beside the cache and shared by the workers as it is; "" without a cache, or on
// the cpu, which has no vendor Find. Only the cuda backend reads it; MIOpen keeps its own Find
// database (MIOPEN_USER_DB_PATH, the daemon's environment).
func FindDB(req *workerkit.LoadRequest) string {
	if req.Backend == "cpu" || req.ConvPolicy == nil || req.ConvPolicy.DecisionCachePath == "" {
		return ""
	}
	return req.ConvPolicy.DecisionCachePath + cudnnFindDBSuffix
}

// newRuntime starts the runtime for req with opts (its backend and device): it adds the memory
// cap, the conv policy, decision cache and hang faults (Config.Conv), and the op observer and
// fault hook, after installing req.Fault's injector.
func (b *Base) newRuntime(req *workerkit.LoadRequest, opts runtime.Options) (*runtime.Runtime, error) {
	if req.MemoryCapBytes > math.MaxInt64 {
		return nil, workerkit.InvalidArgumentf("memory cap %d too large", req.MemoryCapBytes)
	}
	if len(req.Loras) > 0 && !b.loras {
		return nil, workerkit.InvalidArgumentf("the %s worker does not take LoRAs (only the transformer does)", b.name)
	}
	if (req.Checkpoint != "" || req.Weights != "") && !b.loras {
		return nil, workerkit.InvalidArgumentf("the %s worker does not take a checkpoint file or a weights choice (only the transformer does)", b.name)
	}
	opts.MemoryCap = int64(req.MemoryCapBytes)
	inj, err := faults.New(req.Fault, faults.Caps{Conv: b.conv}, b.Beacon, b.Log)
	if err != nil {
		return nil, workerkit.InvalidArgumentf("%v", err)
	}
	b.inj.Store(inj) // read by the op observer from the first op on
	if b.conv {
		if err := b.convOptions(req, &opts); err != nil {
			return nil, err
		}
		opts.FindDB = FindDB(req)
	}
	opts.OpObserver = b.Observe
	opts.OpFault = b.opFault
	rt, err := runtime.New(opts)
	if err != nil || req.Fault == nil || !req.Fault.OOMAtLoad {
		return rt, err
	}
	// Fault.oom_at_load: the allocator's own cap check fails the Load's first allocation with
	// the runtime's typed out of memory, as a device too full for the weights would.
	b.Log.Warn("fault: out of memory at load (allocator capped at one byte)")
	if err := rt.SetMemoryCap(1); err != nil {
		_ = rt.Close()
		return nil, fmt.Errorf("fault: oom_at_load: %w", err)
	}
	return rt, nil
}
