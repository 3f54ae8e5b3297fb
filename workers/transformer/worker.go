package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/faults"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/workers/transformer/dit"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// errInvalid marks a bad request found by the worker itself.
var errInvalid = errors.New("invalid argument")

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errInvalid}, args...)...)
}

// worker serves transformer_section and transformer_forward stages.
type worker struct {
	k   *workerkit.Kit
	log *logrus.Entry

	// mu protects rt, model and dtype; Run holds it for the whole stage.
	mu    sync.Mutex
	rt    *runtime.Runtime
	model *dit.Model
	dtype sampler.DType
	// inj keeps the beacon and fires the test faults of LoadRequest.Fault (package faults);
	// Load replaces it before any op runs.
	inj atomic.Pointer[faults.Injector]

	computeNanos atomic.Int64
	loadNanos    atomic.Int64
	// loaded holds the runtime once Load succeeded, for Stats while a stage holds mu.
	loaded atomic.Pointer[runtime.Runtime]

	// opsMu protects ops.
	opsMu sync.Mutex
	ops   map[string]uint64
}

var _ workerkit.Worker = (*worker)(nil)

func newWorker(k *workerkit.Kit) *worker {
	log := k.Log
	if log == nil {
		log = logrus.NewEntry(logrus.StandardLogger())
	}
	w := &worker{k: k, log: log.WithField("worker", "transformer"), ops: map[string]uint64{}}
	inj, _ := faults.New(nil, faults.Caps{}, k.Beacon, w.log) // no fault: never fails
	w.inj.Store(inj)
	return w
}

// classify maps an error to the worker error the supervisor acts on.
func classify(err error) error {
	var oom *runtime.OOMError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &oom):
		return &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: err.Error(),
			RequestedBytes: oom.Requested, AvailableBytes: oom.Available}
	case errors.Is(err, runtime.ErrOutOfMemory):
		return &workerkit.Error{Code: workerkit.CodeOutOfMemory, Message: err.Error()}
	case errors.Is(err, runtime.ErrDeviceLost):
		return &workerkit.Error{Code: workerkit.CodeDeviceLost, Message: err.Error()}
	case errors.Is(err, errInvalid), errors.Is(err, dit.ErrInvalidInput), errors.Is(err, dit.ErrUnsupportedConfig),
		errors.Is(err, dit.ErrBadCheckpoint), errors.Is(err, sampler.ErrBadRequest):
		return &workerkit.Error{Code: workerkit.CodeInvalidArgument, Message: err.Error()}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &workerkit.Error{Code: workerkit.CodeCancelled, Message: err.Error()}
	}
	return err
}

// observe is the runtime's op observer: it keeps the beacon current, counts ops and fires
// injected faults.
func (w *worker) observe(e runtime.OpEvent) {
	w.k.Beacon.SetBytes(int64(e.Bytes)) // the allocator's bytes, per op (begin: output allocated; end: scratch freed)
	if e.Phase == runtime.OpEnd {
		w.k.Beacon.EndOp()
		return
	}
	w.opsMu.Lock()
	w.ops[e.Op]++
	w.opsMu.Unlock()
	// The beacon's op number, which Fault counts in; faults fire here (package faults).
	w.inj.Load().BeginOp(e.Op, "", "", e.Seq)
}

// Load opens the cpu runtime and loads the transformer from req.ModelDir.
func (w *worker) Load(ctx context.Context, req *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.model != nil {
		return nil, classify(invalidf("load: already loaded"))
	}
	start := time.Now()
	if req.ModelDir == "" {
		return nil, classify(invalidf("load: model_dir is required"))
	}
	switch req.Backend {
	case "", "auto", "cpu":
	default:
		return nil, workerkit.Errorf(workerkit.CodeInternal, "load: backend %q is not available in this build (cpu only)", req.Backend)
	}
	// The cpu backend computes in fp32, so fm_wrapper (which rounds the model's inputs to its
	// dtype) has nothing to round; dtype says what the weight matrices are kept in ("fp16"/"bf16",
	// or "auto": the checkpoint's own dtype).
	wdt, err := runtime.ParseWeightDType(req.DType)
	if err != nil {
		return nil, classify(invalidf("load: %v", err))
	}
	w.dtype = sampler.F32
	inj, err := faults.New(req.Fault, faults.Caps{}, w.k.Beacon, w.log)
	if err != nil {
		return nil, classify(invalidf("load: %v", err))
	}
	w.inj.Store(inj)
	for k, v := range req.Env {
		if err := os.Setenv(k, v); err != nil {
			return nil, classify(invalidf("load: env %s: %v", k, err))
		}
	}
	if req.MemoryCapBytes > math.MaxInt64 {
		return nil, classify(invalidf("load: memory cap %d too large", req.MemoryCapBytes))
	}
	rt, err := runtime.New(runtime.Options{MemoryCap: int64(req.MemoryCapBytes), OpObserver: w.observe,
		OpFault: func(e runtime.OpEvent) error { // oom_at_op fails that op itself
			return w.inj.Load().OpErr(e.Seq, e.OutBytes, e.Bytes, e.Cap)
		}})
	if err != nil {
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	m, err := dit.Load(rt, req.ModelDir, dit.LoadOptions{WeightDType: wdt})
	if err != nil {
		rt.Close()
		var oom *runtime.OOMError
		if !errors.As(err, &oom) {
			// A folder that cannot be read, parsed or bound will not load on a retry either.
			return nil, &workerkit.Error{Code: workerkit.CodeInvalidArgument, Message: fmt.Sprintf("load %s: %v", req.ModelDir, err)}
		}
		return nil, classify(fmt.Errorf("load %s: %w", req.ModelDir, err))
	}
	w.rt, w.model = rt, m
	w.loaded.Store(rt)
	loadTime := time.Since(start)
	w.loadNanos.Store(int64(loadTime))
	cfg := m.Config
	w.log.WithFields(logrus.Fields{"params": m.NumParams(), "bytes": m.WeightBytes(), "weights": wdt.String(), "double_blocks": cfg.NumLayers,
		"single_blocks": cfg.NumSingleLayers, "heads": cfg.NumAttentionHeads, "head_dim": cfg.AttentionHeadDim,
		"elapsed": loadTime}).Info("model loaded")
	for _, n := range m.Unexpected {
		w.log.WithField("tensor", n).Warn("unexpected tensor in checkpoint")
	}
	if req.MaxResidentBlocks != 0 {
		w.log.WithField("max_resident_blocks", req.MaxResidentBlocks).Info("cpu backend: every block stays resident")
	}
	mem := rt.Memory()
	w.k.Beacon.SetBytes(int64(mem.Allocated))
	info := rt.Backend()
	return &workerkit.LoadResponse{
		Backend: info.Name, DType: "fp32",
		Device:               &workerkit.Device{Index: uint32(info.Device), Name: info.DeviceName, TotalMemoryBytes: info.DeviceMemory},
		WeightBytes:          uint64(m.WeightBytes()),
		DeviceAllocatedBytes: mem.Allocated,
		LoadDuration:         loadTime,
		Transformer:          transformerInfo(m),
	}, nil
}

// transformerInfo is the model's constants as LoadResponse reports them to the supervisor.
func transformerInfo(m *dit.Model) *workerkit.TransformerInfo {
	u := func(n int) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }
	c := m.Config
	info := &workerkit.TransformerInfo{
		InChannels: u(c.InChannels), OutChannels: u(c.OutChannelsOrIn()), PatchSize: u(c.PatchSize), PatchSizeT: u(c.PatchSizeT),
		TextEmbedDim: u(c.TextEmbedDim), PooledProjectionDim: u(c.PooledProjectionDim),
		NumLayers: u(c.NumLayers), NumSingleLayers: u(c.NumSingleLayers), HasCleanXEmbedder: m.CleanXEmbedder != nil,
	}
	if m.ImageProjection != nil {
		info.ImageProjDim = u(c.ImageProjDim)
	}
	return info
}

// Run serves one transformer_section or transformer_forward stage.
func (w *worker) Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (*workerkit.Result, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.model == nil {
		return nil, classify(invalidf("run: not loaded"))
	}
	start := time.Now()
	defer func() { w.computeNanos.Add(int64(time.Since(start))) }()
	log := w.log.WithField("job", req.JobID)
	var stage string
	var res *workerkit.Result
	var err error
	switch s := req.Stage.(type) {
	case *workerkit.TransformerSectionRequest:
		stage = "transformer_section"
		res, err = w.section(ctx, s, emit, start, log.WithField("stage", stage))
	case *workerkit.TransformerForwardRequest:
		stage = "transformer_forward"
		res, err = w.forward(ctx, s, emit, start, log.WithField("stage", stage))
	default:
		return nil, classify(invalidf("run: the transformer worker runs transformer_section and transformer_forward stages, not %T", req.Stage))
	}
	log = log.WithField("stage", stage)
	if err != nil {
		err = classify(fmt.Errorf("%s: %w", stage, err))
		log.WithError(err).Warn("stage failed")
		return nil, err
	}
	log.WithField("elapsed", time.Since(start)).Info("stage done")
	return res, nil
}

// Stats reports the runtime's memory, op counts and timings.
func (w *worker) Stats(ctx context.Context) (*workerkit.Stats, error) {
	return w.stats(), nil
}

func (w *worker) stats() *workerkit.Stats {
	st := &workerkit.Stats{LoadTime: time.Duration(w.loadNanos.Load()), ComputeTime: time.Duration(w.computeNanos.Load()),
		OpCounts: map[string]uint64{}}
	if rt := w.loaded.Load(); rt != nil {
		m := rt.Memory()
		st.AllocatorCurrentBytes, st.AllocatorPeakBytes, st.MemoryCapBytes = m.Allocated, m.Peak, m.Cap
		for i, t := range rt.ConvStats().Tiers {
			if t.Attempts == 0 && t.SkippedHung == 0 {
				continue
			}
			st.ConvTiers = append(st.ConvTiers, workerkit.ConvTierStats{Tier: workerkit.ConvTier(i + 1),
				Attempts: uint64(t.Attempts), Successes: uint64(t.Successes), Failures: uint64(t.Failures),
				SkippedAsHung: uint64(t.SkippedHung), Time: t.Time})
		}
	}
	st.HostRSSBytes = hostRSS()
	w.opsMu.Lock()
	for k, v := range w.ops {
		st.OpCounts[k] = v
	}
	w.opsMu.Unlock()
	return st
}

// hostRSS reads the process's resident set size from /proc (0 when unavailable).
func hostRSS() uint64 {
	raw, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(raw))
	if len(f) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(f[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}

// Probe is refused: device probing is the probe worker's job.
func (w *worker) Probe(context.Context, *workerkit.ProbeRequest) (*workerkit.ProbeResponse, error) {
	return nil, classify(invalidf("probe: the transformer worker does not probe devices"))
}
