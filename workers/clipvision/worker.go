package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/convcache"
	"github.com/framepackd/framepackd/internal/faults"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/workers/clipvision/siglip"
)

// EnvProcessorBackend chooses the SiglipImageProcessor implementation the worker reproduces:
// "torchvision" (the default: transformers 5, which made the parity fixtures) or "pil"
// (transformers 4's Pillow path, which the original FramePack used). It is read after Load has
// applied LoadRequest.Env, so the supervisor can set it per load.
const EnvProcessorBackend = "FRAMEPACK_SIGLIP_PROCESSOR"

// worker is the clipvision worker. Load happens once, before any Run (workerkit enforces it).
type worker struct {
	k   *workerkit.Kit
	log *logrus.Entry

	// mu protects rt and enc; Run holds it for the whole stage.
	mu  sync.Mutex
	rt  *runtime.Runtime
	enc *siglip.Encoder
	// inj keeps the beacon and fires the test faults of LoadRequest.Fault (package faults);
	// Load replaces it before any op runs.
	inj atomic.Pointer[faults.Injector]

	// Stats reads these without mu, so it answers while a stage runs.
	loaded       atomic.Pointer[runtime.Runtime]
	loadNanos    atomic.Int64
	computeNanos atomic.Int64
	stages       atomic.Uint64
}

var _ workerkit.Worker = (*worker)(nil)

func newWorker(k *workerkit.Kit) *worker {
	log := k.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	w := &worker{k: k, log: log}
	inj, _ := faults.New(nil, faults.Caps{}, k.Beacon, log) // no fault: never fails
	w.inj.Store(inj)
	return w
}

// modelDirs finds the image encoder and feature extractor folders from LoadRequest.model_dir:
// either a FLUX Redux folder holding image_encoder/ and feature_extractor/, or the
// image_encoder folder itself, with preprocessor_config.json beside config.json or in
// ../feature_extractor.
func modelDirs(dir string) (enc, fe string, err error) {
	exists := func(p string) bool { _, err := os.Stat(p); return err == nil }
	switch {
	case dir == "":
		return "", "", workerkit.Errorf(workerkit.CodeInvalidArgument, "load: model_dir is required")
	case exists(filepath.Join(dir, "image_encoder", "config.json")):
		enc = filepath.Join(dir, "image_encoder")
	case exists(filepath.Join(dir, "config.json")):
		enc = dir
	default:
		return "", "", workerkit.Errorf(workerkit.CodeInvalidArgument,
			"load: %s holds neither image_encoder/config.json nor config.json", dir)
	}
	for _, cand := range []string{filepath.Join(dir, "feature_extractor"), enc, filepath.Join(filepath.Dir(enc), "feature_extractor")} {
		if exists(filepath.Join(cand, "preprocessor_config.json")) {
			return enc, cand, nil
		}
	}
	return "", "", workerkit.Errorf(workerkit.CodeInvalidArgument,
		"load: no feature_extractor/preprocessor_config.json for %s", dir)
}

// Load opens the cpu runtime and loads the encoder.
func (w *worker) Load(ctx context.Context, req *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	start := time.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.enc != nil {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: already loaded")
	}
	inj, err := faults.New(req.Fault, faults.Caps{Conv: true}, w.k.Beacon, w.log)
	if err != nil {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: %v", err)
	}
	w.inj.Store(inj)
	for k, v := range req.Env {
		if err := os.Setenv(k, v); err != nil {
			return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: set %s: %v", k, err)
		}
	}
	switch req.Backend {
	case "", "auto", "cpu":
	default:
		return nil, workerkit.Errorf(workerkit.CodeInternal, "load: backend %q is not available in this build", req.Backend)
	}
	// The cpu backend computes in fp32; dtype says what the weight matrices are kept in
	// ("fp16"/"bf16", or "auto": the checkpoint's own dtype).
	wdt, err := runtime.ParseWeightDType(req.DType)
	if err != nil {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: %v", err)
	}
	backend, err := siglip.ParseBackend(os.Getenv(EnvProcessorBackend))
	if err != nil {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: %v", err)
	}
	encDir, feDir, err := modelDirs(req.ModelDir)
	if err != nil {
		return nil, err
	}
	opts, err := w.runtimeOptions(req)
	if err != nil {
		return nil, err
	}
	rt, err := runtime.New(opts)
	if err != nil {
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	enc, err := siglip.LoadEncoder(rt, encDir, feDir, backend, siglip.LoadOptions{WeightDType: wdt})
	if err != nil {
		rt.Close()
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	if err := ctx.Err(); err != nil {
		enc.Free()
		rt.Close()
		return nil, fmt.Errorf("load: %w", err)
	}
	w.rt, w.enc = rt, enc
	w.loaded.Store(rt)
	w.loadNanos.Store(int64(time.Since(start)))

	rep := enc.Model.Report()
	cfg := enc.Model.Config
	pc := enc.Processor.Config()
	w.log.WithFields(logrus.Fields{
		"image_encoder": encDir, "feature_extractor": feDir, "processor": string(backend),
		"layers": cfg.NumHiddenLayers, "hidden": cfg.HiddenSize, "image_size": cfg.ImageSize,
		"patch_size": cfg.PatchSize, "resize": fmt.Sprintf("%dx%d", pc.Height, pc.Width),
		"tensors": rep.Loaded, "weight_bytes": rep.Bytes, "weights": wdt.String(), "prefix": rep.Prefix,
		"duration": time.Since(start).Round(time.Millisecond).String(),
	}).Info("siglip loaded")
	if len(rep.Skipped) > 0 {
		w.log.WithFields(logrus.Fields{"count": len(rep.Skipped), "first": rep.Skipped[0]}).
			Info("pooling head tensors skipped: last_hidden_state does not use them")
	}
	if len(rep.Unexpected) > 0 {
		w.log.WithFields(logrus.Fields{"count": len(rep.Unexpected), "names": strings.Join(rep.Unexpected, ",")}).
			Warn("unexpected checkpoint tensors ignored")
	}
	info := rt.Backend()
	return &workerkit.LoadResponse{
		Backend: "cpu",
		DType:   "fp32",
		Device: &workerkit.Device{Index: uint32(info.Device), Name: info.DeviceName, Arch: "cpu",
			TotalMemoryBytes: info.DeviceMemory},
		WeightBytes:          uint64(rep.Bytes),
		DeviceAllocatedBytes: rt.Memory().Allocated,
		LoadDuration:         time.Since(start),
	}, nil
}

// runtimeOptions maps the load request onto the runtime: memory cap, conv policy and decision
// cache, and the beacon and fault hooks.
func (w *worker) runtimeOptions(req *workerkit.LoadRequest) (runtime.Options, error) {
	opts := runtime.Options{MemoryCap: int64(min(req.MemoryCapBytes, 1<<62))}
	if p := req.ConvPolicy; p != nil {
		if p.DecisionCachePath != "" {
			c, err := convcache.Open(p.DecisionCachePath)
			if err != nil {
				return opts, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: %v", err)
			}
			if lerr := c.LoadError(); lerr != nil {
				w.log.WithError(lerr).Warn("conv decision cache unreadable; starting empty")
			}
			opts.ConvCache = c
		}
		if p.ForcedTier != workerkit.ConvTierUnspecified {
			t, ok := tierOf(p.ForcedTier)
			if !ok {
				return opts, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: conv tier %d", p.ForcedTier)
			}
			opts.ConvPolicy.FirstTier = t
		}
		for _, o := range p.TierOverrides { // later entries for a shape win
			t, ok := tierOf(o.Tier)
			if !ok || o.ShapeKey == "" {
				return opts, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: conv tier override %q: shape key and tier (%d) are required", o.ShapeKey, o.Tier)
			}
			if opts.ConvPolicy.TierOverrides == nil {
				opts.ConvPolicy.TierOverrides = map[string]runtime.Tier{}
			}
			opts.ConvPolicy.TierOverrides[o.ShapeKey] = t
		}
		if n := len(opts.ConvPolicy.TierOverrides); n > 0 {
			w.log.WithField("count", n).Info("conv tier overrides") // SigLIP has one conv: the patch embedding
		}
	}
	f := req.Fault
	if f != nil {
		if f.HangConvTier != workerkit.ConvTierUnspecified {
			t, ok := tierOf(f.HangConvTier)
			if !ok {
				return opts, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: fault conv tier %d", f.HangConvTier)
			}
			opts.ConvFaults = append(opts.ConvFaults, runtime.ConvFault{Key: f.HangConvShapeKey, Tier: t, Mode: runtime.FaultHang})
		}
	}
	opts.OpObserver = w.observe
	opts.OpFault = func(e runtime.OpEvent) error { // oom_at_op fails that op itself
		return w.inj.Load().OpErr(e.Seq, e.OutBytes, e.Bytes, e.Cap)
	}
	return opts, nil
}

// tierOf maps a protocol conv tier to the runtime's.
func tierOf(t workerkit.ConvTier) (runtime.Tier, bool) {
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

// observe publishes every runtime op on the beacon and applies the test faults that trigger at
// an op number. It runs on the op's goroutine and must not call into the runtime.
func (w *worker) observe(e runtime.OpEvent) {
	b := w.k.Beacon
	b.SetBytes(int64(e.Bytes)) // the allocator's bytes, per op (begin: output allocated; end: scratch freed)
	if e.Phase == runtime.OpEnd {
		b.EndOp()
		return
	}
	tier := ""
	if e.Key != "" {
		tier = e.Tier.String() // a conv tier attempt: the watchdog can name the shape and tier if it hangs
	}
	// The beacon's op number, which Fault counts in; faults fire here (package faults). (The
	// Go runtime catches SIGABRT, SIGSEGV, …: an injected one ends the process with exit
	// status 2 after a goroutine dump, not as a signal death.)
	w.inj.Load().BeginOp(e.Op, e.Key, tier, e.Seq)
}

// Run runs one image_encode stage.
func (w *worker) Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (*workerkit.Result, error) {
	st, ok := req.Stage.(*workerkit.ImageEncodeRequest)
	if !ok {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "run: the clipvision worker runs image_encode, got %T", req.Stage)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.enc == nil {
		return nil, workerkit.Errorf(workerkit.CodeInternal, "run: not loaded")
	}
	start := time.Now()
	log := w.log.WithField("stage", "image_encode")
	if req.JobID != "" {
		log = log.WithField("job", req.JobID)
	}
	res, err := w.encode(ctx, st, emit, start)
	w.computeNanos.Add(int64(time.Since(start)))
	w.stages.Add(1)
	if err != nil {
		err = classify(fmt.Errorf("image_encode: %w", err))
		log.WithError(err).WithField("code", workerkit.CodeOf(err).String()).Warn("stage failed")
		return nil, err
	}
	log.WithField("duration", time.Since(start).Round(time.Millisecond).String()).Info("stage done")
	res.Stats = w.stats()
	return res, nil
}

func (w *worker) encode(ctx context.Context, st *workerkit.ImageEncodeRequest, emit workerkit.Emit, start time.Time) (*workerkit.Result, error) {
	outDType, err := checkOutputRef(st.LastHiddenState)
	if err != nil {
		return nil, err
	}
	img, err := readImage(st.Image)
	if err != nil {
		return nil, err
	}
	defer img.close()
	if err := emit(&workerkit.Progress{Phase: "preprocess", Elapsed: time.Since(start)}); err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	enc := w.enc
	pv, err := enc.Processor.Preprocess(img.pix, img.height, img.width, img.channels)
	if err != nil {
		return nil, err
	}
	oh, ow := enc.Processor.OutputSize(img.height, img.width)
	n := enc.Model.Config.NumHiddenLayers
	hook := func(i int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.inj.Load().Err(); err != nil {
			return err // injected out of memory (a test fault)
		}
		w.k.Beacon.SetStep(i, n)
		if i == 0 {
			return nil
		}
		return emit(&workerkit.Progress{Phase: "encode", Step: uint32(i), TotalSteps: uint32(n), Elapsed: time.Since(start)})
	}
	out, shape, err := enc.Model.ForwardHost(pv, []int{1, 3, oh, ow}, hook)
	w.k.Beacon.SetStep(0, 0)
	if err == nil {
		err = w.inj.Load().Err() // injected out of memory in the last layer (a test fault)
	}
	if err != nil {
		return nil, err
	}
	if err := emit(&workerkit.Progress{Phase: "write", Elapsed: time.Since(start)}); err != nil {
		return nil, fmt.Errorf("emit: %w", err)
	}
	ref, err := writeOutput(st.LastHiddenState, outDType, out, shape)
	if err != nil {
		return nil, err
	}
	return &workerkit.Result{Outputs: []workerkit.TensorRef{ref}}, nil
}

// classify gives err the protocol code the supervisor acts on (unless it already has one): bad
// input, out of memory, device lost, cancelled, else internal.
func classify(err error) error {
	var we *workerkit.Error
	var oom *runtime.OOMError
	switch {
	case err == nil || errors.As(err, &we):
		return err
	case errors.Is(err, siglip.ErrBadInput), errors.Is(err, errBadRequest):
		return &workerkit.Error{Code: workerkit.CodeInvalidArgument, Message: err.Error()}
	case errors.Is(err, siglip.ErrCheckpoint):
		return &workerkit.Error{Code: workerkit.CodeInvalidArgument, Message: err.Error()}
	case errors.As(err, &oom):
		return &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: err.Error(),
			RequestedBytes: oom.Requested, AvailableBytes: oom.Available}
	case errors.Is(err, runtime.ErrOutOfMemory):
		return &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: err.Error()}
	case errors.Is(err, runtime.ErrDeviceLost):
		return &workerkit.Error{Code: workerkit.CodeDeviceLost, Message: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &workerkit.Error{Code: workerkit.CodeCancelled, Message: err.Error()}
	}
	return &workerkit.Error{Code: workerkit.CodeInternal, Message: err.Error()}
}

// Stats reports memory, timings and conv tiers; it does not wait for a running stage.
func (w *worker) Stats(context.Context) (*workerkit.Stats, error) {
	return w.stats(), nil
}

func (w *worker) stats() *workerkit.Stats {
	s := &workerkit.Stats{LoadTime: time.Duration(w.loadNanos.Load()), ComputeTime: time.Duration(w.computeNanos.Load()),
		OpCounts: map[string]uint64{"image_encode": w.stages.Load()}}
	if rss, err := hostRSS(); err == nil {
		s.HostRSSBytes = rss
	}
	rt := w.loaded.Load()
	if rt == nil {
		return s
	}
	rs := rt.Stats()
	s.AllocatorCurrentBytes, s.AllocatorPeakBytes, s.MemoryCapBytes = rs.Memory.Allocated, rs.Memory.Peak, rs.Memory.Cap
	s.OpCounts["runtime_ops"] = rs.Ops
	for t, ts := range rs.Conv.Tiers {
		if ts.Attempts == 0 && ts.SkippedHung == 0 {
			continue
		}
		s.ConvTiers = append(s.ConvTiers, workerkit.ConvTierStats{Tier: protoTier(runtime.Tier(t)),
			Attempts: uint64(ts.Attempts), Successes: uint64(ts.Successes), Failures: uint64(ts.Failures),
			SkippedAsHung: uint64(ts.SkippedHung), Time: ts.Time})
	}
	return s
}

func protoTier(t runtime.Tier) workerkit.ConvTier {
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

// Probe is refused: device probes are the probe worker's.
func (w *worker) Probe(context.Context, *workerkit.ProbeRequest) (*workerkit.ProbeResponse, error) {
	return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "clipvision worker: probe: use the probe worker")
}
