// Package modelrt is what the model workers (textenc, vae, clipvision, transformer) share on
// top of internal/runtime: the one path from a LoadRequest to a runtime (Base.Open: backend,
// device and PCI bus id, the worker's environment, memory cap, conv policy, decision cache and
// vendor Find database, test faults), the op observer that keeps the beacon current and counts ops,
// the LoadResponse and Stats built from the runtime, and the error codes the supervisor acts on.
// It is apart from workerkit because it links the native runtime, which the supervisor does not.
package modelrt

import (
	"context"
	"errors"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/beacon"
	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/envconfig"
	"github.com/framepackd/framepackd/internal/faults"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
)

// Config says what a worker's model asks of the shared part.
type Config struct {
	// Name is the worker's name, the "worker" field of its log lines ("vae").
	Name string
	// Conv says the model runs convolutions through the runtime's conv chain and the worker
	// honours what is about them: LoadRequest.conv_policy (forced tier, per-shape overrides,
	// decision cache), the vendor Find database beside the cache (FindDB), the hang_conv
	// faults, the shape and tier of a conv on the beacon, and ConvFallback events
	// (DrainConvEvents). Without it the conv policy is ignored and a hang_conv fault is refused.
	Conv bool
	// Loras says the worker merges LoadRequest.loras into its model and takes the
	// transformer's other load fields (checkpoint, weights); the others refuse a request that
	// names LoRAs, a checkpoint file or a weights choice.
	Loras bool
	// BlockStack names the model's stack of blocks that stream from host memory beyond
	// LoadRequest.max_resident_blocks ("transformer blocks"); "" for a model without one. Its
	// length comes with the residency (SetResidency).
	BlockStack string
	// Tiles says the model's stages take spatial tiles (the VAE).
	Tiles bool
}

// Base is the part of a model worker that is the same in every one: its logger and beacon, the
// fault injector of its LoadRequest, its runtime's op observer, op counts and timings. It is
// safe for concurrent use; Stats answers while a stage runs.
type Base struct {
	// Log is the worker's logger (with the "worker" field).
	Log *logrus.Entry
	// Beacon is the worker's beacon (nil: none, every call a no-op).
	Beacon *beacon.Writer

	conv  bool
	loras bool
	name  string
	stack string
	tiles bool
	// inj keeps the beacon and fires the test faults of LoadRequest.Fault; NewRuntime replaces
	// it before the first op.
	inj atomic.Pointer[faults.Injector]
	// rt is the loaded runtime (nil before Loaded), for Stats.
	rt           atomic.Pointer[runtime.Runtime]
	loadNanos    atomic.Int64
	computeNanos atomic.Int64
	// act is the activation dtype Activation chose (0 before; Loaded reports it), and
	// narrower the dtype it could run in instead (0: none; a GPU at f32 runs the model's own).
	act      atomic.Int32
	narrower atomic.Int32

	// mu protects ops, convEvents and lastFailed (written by the op observer).
	mu         sync.Mutex
	ops        map[string]uint64
	convEvents []workerkit.ConvFallback
	lastFailed string // shape key whose last tier attempt failed
}

// New returns the shared part of the worker k serves.
func New(k *workerkit.Kit, cfg Config) *Base {
	log := k.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	b := &Base{Log: log.WithField("worker", cfg.Name), Beacon: k.Beacon, conv: cfg.Conv, loras: cfg.Loras, name: cfg.Name,
		stack: cfg.BlockStack, tiles: cfg.Tiles, ops: map[string]uint64{}}
	inj, _ := faults.New(nil, faults.Caps{}, k.Beacon, b.Log) // no fault: never fails
	b.inj.Store(inj)
	return b
}

// CheckDTypes checks req's dtype names (LoadRequest.dtype and activation_dtype) before
// anything is opened, so a bad name fails fast as an invalid argument.
func CheckDTypes(req *workerkit.LoadRequest) error {
	if _, err := runtime.ParseWeightDType(req.DType); err != nil {
		return workerkit.InvalidArgumentf("%v", err)
	}
	if req.ActivationDType != "" {
		if _, err := runtime.ParseActivationDType(req.ActivationDType); err != nil {
			return workerkit.InvalidArgumentf("activation_dtype: %v", err)
		}
	}
	return nil
}

// ActivationEnv names the test knob (envconfig.ActivationDType) that sets every model's
// activation dtype ("fp32"/"f32", "bf16", "fp16"/"f16") where LoadRequest.activation_dtype is
// empty: the f32 parity runs on a GPU set it to f32.
var ActivationEnv = envconfig.ActivationDType.Name

// Activation returns the activation dtype and the weight-matrix dtype a model is loaded with
// on rt: req.ActivationDType, else the test knob ActivationEnv, else F32 on a host backend and
// gpuDefault (the dtype FramePack runs that model in) on a GPU; the weights as req.DType says,
// empty following the activation dtype (FramePack casts each model whole). It records the
// activation dtype for Loaded. Bad names are invalid arguments.
func (b *Base) Activation(req *workerkit.LoadRequest, rt *runtime.Runtime, gpuDefault runtime.DType) (act, weights runtime.DType, err error) {
	act, weights, err = chooseDTypes(req, envconfig.ActivationDType.Get(), rt.Backend().IsHost, gpuDefault)
	if err != nil {
		return 0, 0, err
	}
	if act != runtime.F32 && weights != act && weights != runtime.AsStored {
		// a GPU then widens both operands of every product to f32: right, but off the matrix units
		b.Log.WithFields(logrus.Fields{"activations": act.String(), "weights": weights.String()}).
			Warn("weights and activations differ in dtype: products run in f32")
	}
	b.act.Store(int32(act))
	if !rt.Backend().IsHost && act == runtime.F32 && gpuDefault != runtime.F32 {
		b.narrower.Store(int32(gpuDefault)) // the model's own 16-bit dtype, on the matrix units
	}
	return act, weights, nil
}

// chooseDTypes is Activation's rule, with the environment's value env and whether the backend
// is the host's.
func chooseDTypes(req *workerkit.LoadRequest, env string, host bool, gpuDefault runtime.DType) (act, weights runtime.DType, err error) {
	name, from := req.ActivationDType, "activation_dtype"
	if name == "" {
		name, from = env, ActivationEnv
	}
	switch {
	case name != "":
		if act, err = runtime.ParseActivationDType(name); err != nil {
			return 0, 0, workerkit.InvalidArgumentf("%s: %v", from, err)
		}
	case host:
		act = runtime.F32
	default:
		act = gpuDefault // F32 (the zero value) when the model has none
	}
	weights = act
	if req.DType != "" {
		if weights, err = runtime.ParseWeightDType(req.DType); err != nil {
			return 0, 0, workerkit.InvalidArgumentf("dtype: %v", err)
		}
	}
	return act, weights, nil
}

// convOptions maps req's conv policy and hang_conv fault onto opts.
func (b *Base) convOptions(req *workerkit.LoadRequest, opts *runtime.Options) error {
	if f := req.Fault; f != nil && f.HangConvTier != workerkit.ConvTierUnspecified {
		tier, ok := RuntimeTier(f.HangConvTier)
		if !ok {
			return workerkit.InvalidArgumentf("fault: hang_conv_tier %d", f.HangConvTier)
		}
		// A tier this backend lacks still hangs: the fault stands in for a vendor library.
		opts.ConvFaults = append(opts.ConvFaults, runtime.ConvFault{Key: f.HangConvShapeKey, Tier: tier, Mode: runtime.FaultHang})
	}
	p := req.ConvPolicy
	if p == nil {
		return nil
	}
	if p.ForcedTier != workerkit.ConvTierUnspecified {
		tier, ok := RuntimeTier(p.ForcedTier)
		if !ok {
			return workerkit.InvalidArgumentf("conv policy: forced tier %d", p.ForcedTier)
		}
		opts.ConvPolicy.FirstTier = tier
	}
	for _, o := range p.TierOverrides { // later entries for a shape win
		tier, ok := RuntimeTier(o.Tier)
		if !ok || o.ShapeKey == "" {
			return workerkit.InvalidArgumentf("conv policy: tier override %q: shape key and tier (%d) are required", o.ShapeKey, o.Tier)
		}
		if opts.ConvPolicy.TierOverrides == nil {
			opts.ConvPolicy.TierOverrides = map[string]runtime.Tier{}
		}
		opts.ConvPolicy.TierOverrides[o.ShapeKey] = tier
	}
	if n := len(opts.ConvPolicy.TierOverrides); n > 0 {
		b.Log.WithField("overrides", n).Info("conv policy: per-shape first tiers")
	}
	if p.DecisionCachePath != "" {
		cache, err := convcache.Open(p.DecisionCachePath)
		if err != nil {
			return workerkit.InvalidArgumentf("conv decision cache: %w", err)
		}
		if err := cache.LoadError(); err != nil {
			b.Log.WithError(err).Warn("conv decision cache unreadable; starting without it")
		}
		opts.ConvCache = cache
	}
	return nil
}

// Loaded records rt as the worker's loaded runtime (for Stats) and the load time since start,
// puts the allocator's bytes on the beacon, and returns the LoadResponse's common fields: the
// backend, the activation dtype (Activation's, fp32 when it was not called), the device,
// weightBytes, the allocator's bytes and the model's traits (Config; the stack's length comes
// with SetResidency; a GPU load at f32 declares the model's own 16-bit dtype as its fallback).
func (b *Base) Loaded(rt *runtime.Runtime, start time.Time, weightBytes int64) *workerkit.LoadResponse {
	d := time.Since(start)
	b.loadNanos.Store(int64(d))
	b.rt.Store(rt)
	mem := rt.Memory()
	b.Beacon.SetBytes(int64(mem.Allocated))
	info := rt.Backend()
	act := runtime.DType(b.act.Load())
	if act == 0 {
		act = runtime.F32
	}
	return &workerkit.LoadResponse{
		Backend: info.Name, DType: act.ProtoName(),
		Device:               Device(info),
		WeightBytes:          uint64(max(weightBytes, 0)),
		DeviceAllocatedBytes: mem.Allocated,
		LoadDuration:         d,
		Traits:               b.Traits(),
	}
}

// Traits returns the model's traits as the worker knows them (workerkit.TraitsDeclarer): its
// Config, and the narrower dtype once Activation chose the activations; the stack's length comes
// with SetResidency. A worker's Traits method returns these, so that a Load that ran out of
// memory declares them too.
func (b *Base) Traits() *workerkit.ModelTraits {
	traits := &workerkit.ModelTraits{BlockStack: b.stack, Convolves: b.conv, Tiles: b.tiles}
	if n := runtime.DType(b.narrower.Load()); n != 0 {
		traits.FallbackDTypes = []string{n.ProtoName()}
	}
	return traits
}

// SetResidency records in resp the blocks of the model's stack (Config.BlockStack) kept on the
// device and streamed from host memory; their sum is the stack's length (ModelTraits.Blocks).
func SetResidency(resp *workerkit.LoadResponse, resident, streamed int) {
	resp.ResidentBlocks, resp.StreamedBlocks = Uint32(resident), Uint32(streamed)
	if resp.Traits != nil {
		resp.Traits.Blocks = Uint32(resident + streamed)
	}
}

// Device describes the runtime's device as the protocol does (the host's arch for the cpu).
func Device(info runtime.BackendInfo) *workerkit.Device {
	d := &workerkit.Device{Index: uint32(max(info.Device, 0)), Name: info.DeviceName, TotalMemoryBytes: info.DeviceMemory}
	if info.IsHost {
		d.Arch = workerkit.HostArch()
	}
	return d
}

// AddCompute adds a stage's time since start to the compute time Stats reports.
func (b *Base) AddCompute(start time.Time) { b.computeNanos.Add(int64(time.Since(start))) }

// Observe is the runtime's op observer: it keeps the beacon current (allocator bytes, op
// number and name, and for Config.Conv the conv shape and tier), counts ops by name, queues
// conv fallback events and fires injected faults. It runs on the op's thread and is quick.
func (b *Base) Observe(e runtime.OpEvent) {
	b.Beacon.SetBytes(int64(e.Bytes)) // the allocator's bytes, per op (begin: output allocated; end: scratch freed)
	if e.Phase == runtime.OpEnd {
		b.Beacon.EndOp()
		if b.conv && e.Key != "" {
			b.convEnded(e)
		}
		return
	}
	b.mu.Lock()
	b.ops[e.Op]++
	b.mu.Unlock()
	key, tier := "", ""
	if b.conv && e.Key != "" {
		key, tier = e.Key, e.Tier.String() // a conv tier attempt: the watchdog can name the shape and tier if it hangs
	}
	// The beacon's op number, which Fault counts in; faults fire here (package faults).
	b.inj.Load().BeginOp(e.Op, key, tier, e.Seq)
}

// convEnded queues the fallback events of a conv tier attempt that ended: a failure, and the
// success that follows failures of the same shape.
func (b *Base) convEnded(e runtime.OpEvent) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case e.Err != nil && !errors.Is(e.Err, runtime.ErrUnavailable):
		b.convEvents = append(b.convEvents, workerkit.ConvFallback{ShapeKey: e.Key, Tier: ConvTier(e.Tier),
			Outcome: workerkit.ConvOutcomeFailed, Detail: e.Err.Error()})
		b.lastFailed = e.Key
	case e.Err == nil && b.lastFailed == e.Key:
		b.convEvents = append(b.convEvents, workerkit.ConvFallback{ShapeKey: e.Key, Tier: ConvTier(e.Tier),
			Outcome: workerkit.ConvOutcomeSucceeded})
		b.lastFailed = ""
	}
}

// opFault is the runtime's fault hook: the op oom_at_op names fails with the injected out of
// memory before it runs (the observer has just told the injector it began).
func (b *Base) opFault(e runtime.OpEvent) error {
	return b.inj.Load().OpErr(e.Seq, e.OutBytes, e.Bytes, e.Cap)
}

// InjectedOOM returns the injected out-of-memory error once its op has started (a test
// fault); a stage checks it at its steps and before writing outputs.
func (b *Base) InjectedOOM() error { return b.inj.Load().Err() }

// DrainConvEvents returns the queued conv fallback events (Config.Conv) and empties the queue.
func (b *Base) DrainConvEvents() []workerkit.ConvFallback {
	b.mu.Lock()
	defer b.mu.Unlock()
	ev := b.convEvents
	b.convEvents = nil
	return ev
}

// Memory returns the loaded runtime's accounting (zero before Loaded).
func (b *Base) Memory() runtime.MemoryStats {
	if rt := b.rt.Load(); rt != nil {
		return rt.Memory()
	}
	return runtime.MemoryStats{}
}

// Stats reports the runtime's memory, the conv chain's counters by tier, op counts by name,
// the host RSS and the load and compute times.
func (b *Base) Stats() *workerkit.Stats {
	st := &workerkit.Stats{LoadTime: time.Duration(b.loadNanos.Load()), ComputeTime: time.Duration(b.computeNanos.Load()),
		OpCounts: map[string]uint64{}}
	if rt := b.rt.Load(); rt != nil {
		m := rt.Memory()
		st.AllocatorCurrentBytes, st.AllocatorPeakBytes, st.MemoryCapBytes = m.Allocated, m.Peak, m.Cap
		cs := rt.ConvStats()
		for t := runtime.Tier(0); t < runtime.NumTiers; t++ {
			ts := cs.Tiers[t]
			if ts.Attempts == 0 && ts.SkippedHung == 0 {
				continue
			}
			st.ConvTiers = append(st.ConvTiers, workerkit.ConvTierStats{Tier: ConvTier(t),
				Attempts: uint64(ts.Attempts), Successes: uint64(ts.Successes), Failures: uint64(ts.Failures),
				SkippedAsHung: uint64(ts.SkippedHung), Time: ts.Time})
		}
		for _, k := range slices.Sorted(maps.Keys(cs.Shapes)) {
			sh := cs.Shapes[k]
			st.ConvShapes = append(st.ConvShapes, workerkit.ConvShapeStats{ShapeKey: k, Tier: ConvTier(sh.Tier),
				Calls: uint64(sh.Calls), First: sh.First, Time: sh.Time})
		}
	}
	st.HostRSSBytes, _ = workerkit.HostRSS() // 0 when unreadable
	b.mu.Lock()
	for k, v := range b.ops {
		st.OpCounts[k] = v
	}
	b.mu.Unlock()
	return st
}

// ConvTier maps a runtime conv tier to the protocol's.
func ConvTier(t runtime.Tier) workerkit.ConvTier {
	switch t {
	case runtime.TierVendorTuned:
		return workerkit.ConvTierVendorTuned
	case runtime.TierVendorDefault:
		return workerkit.ConvTierVendorDefault
	case runtime.TierOwnKernel:
		return workerkit.ConvTierOwnKernel
	case runtime.TierCPU:
		return workerkit.ConvTierCPU
	}
	return workerkit.ConvTierUnspecified
}

// RuntimeTier maps a protocol conv tier to the runtime's (false for unspecified or unknown).
func RuntimeTier(t workerkit.ConvTier) (runtime.Tier, bool) {
	switch t {
	case workerkit.ConvTierVendorTuned:
		return runtime.TierVendorTuned, true
	case workerkit.ConvTierVendorDefault:
		return runtime.TierVendorDefault, true
	case workerkit.ConvTierOwnKernel:
		return runtime.TierOwnKernel, true
	case workerkit.ConvTierCPU:
		return runtime.TierCPU, true
	}
	return 0, false
}

// Uint32 clamps a model constant into a protocol uint32 field.
func Uint32(n int) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }

// Classify gives err the code the supervisor acts on, unless it already has one (a
// *workerkit.Error): out of memory (with the sizes of a *runtime.OOMError), device lost,
// invalid argument (workerkit.ErrInvalidArgument, faults.ErrInvalid or one of invalid: the
// model's own bad-input and bad-checkpoint errors), cancelled, else internal.
func Classify(err error, invalid ...error) error {
	var we *workerkit.Error
	var oom *runtime.OOMError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &we):
		return err
	case errors.As(err, &oom):
		return &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: err.Error(),
			RequestedBytes: oom.Requested, AvailableBytes: oom.Available}
	case errors.Is(err, runtime.ErrOutOfMemory):
		return &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: err.Error()}
	case errors.Is(err, runtime.ErrDeviceLost):
		return &workerkit.Error{Code: workerkit.CodeDeviceLost, Message: err.Error()}
	case isAny(err, invalid) || errors.Is(err, workerkit.ErrInvalidArgument) || errors.Is(err, faults.ErrInvalid):
		return &workerkit.Error{Code: workerkit.CodeInvalidArgument, Message: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &workerkit.Error{Code: workerkit.CodeCancelled, Message: err.Error()}
	}
	return &workerkit.Error{Code: workerkit.CodeInternal, Message: err.Error()}
}

func isAny(err error, targets []error) bool {
	for _, t := range targets {
		if errors.Is(err, t) {
			return true
		}
	}
	return false
}

// ClassifyLoad is Classify for a model that failed to load: anything but running out of memory
// (or an already classified error) is InvalidArgument, since a folder that cannot be read,
// parsed or bound will not load on a retry either.
func ClassifyLoad(err error) error {
	var we *workerkit.Error
	if err == nil || errors.As(err, &we) || errors.Is(err, runtime.ErrOutOfMemory) || errors.As(err, new(*runtime.OOMError)) {
		return Classify(err)
	}
	return &workerkit.Error{Code: workerkit.CodeInvalidArgument, Message: err.Error()}
}
