package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/faults"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/tokenizer"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/workers/textenc/internal/nn"
)

// worker serves text_encode stages.
type worker struct {
	k   *workerkit.Kit
	log *logrus.Entry

	// runMu serialises Load and Run.
	runMu sync.Mutex
	// inj keeps the beacon and fires the test faults of LoadRequest.Fault (package faults);
	// Load replaces it before any op runs.
	inj atomic.Pointer[faults.Injector]

	// mu protects rt, enc and loadTime (set once by Load); Stats takes it only briefly, so it
	// answers while a stage runs.
	mu       sync.Mutex
	rt       *runtime.Runtime
	enc      *Encoder
	loadTime time.Duration

	computeNanos atomic.Int64

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
	w := &worker{k: k, log: log.WithField("worker", "textenc"), ops: map[string]uint64{}}
	inj, _ := faults.New(nil, faults.Caps{}, k.Beacon, w.log) // no fault: never fails
	w.inj.Store(inj)
	return w
}

// invalid returns err as an InvalidArgument worker error.
func invalid(err error) error {
	return &workerkit.Error{Code: workerkit.CodeInvalidArgument, Message: err.Error()}
}

// classify maps an error of loading or encoding to the worker error the supervisor acts on.
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
	case errors.Is(err, ErrInvalidArgument), errors.Is(err, nn.ErrBadInput), errors.Is(err, tokenizer.ErrInvalidPrompt):
		return invalid(err)
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

// Load opens the cpu runtime and loads both text encoders from the snapshot folder
// req.ModelDir (text_encoder/, text_encoder_2/, tokenizer/, tokenizer_2/).
func (w *worker) Load(ctx context.Context, req *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	w.runMu.Lock()
	defer w.runMu.Unlock()
	if w.loaded() != nil {
		return nil, invalid(errors.New("load: already loaded"))
	}
	start := time.Now()
	if req.ModelDir == "" {
		return nil, invalid(errors.New("load: model_dir is required"))
	}
	switch req.Backend {
	case "", "auto", "cpu":
	default:
		return nil, workerkit.Errorf(workerkit.CodeInternal, "load: backend %q is not available in this build (cpu only)", req.Backend)
	}
	// The cpu backend computes in fp32; dtype says what the weight matrices are kept in
	// ("fp16"/"bf16", or "auto": the checkpoints' own dtype).
	wdt, err := runtime.ParseWeightDType(req.DType)
	if err != nil {
		return nil, invalid(fmt.Errorf("load: %w", err))
	}
	inj, err := faults.New(req.Fault, faults.Caps{}, w.k.Beacon, w.log)
	if err != nil {
		return nil, invalid(fmt.Errorf("load: %w", err))
	}
	w.inj.Store(inj)
	for k, v := range req.Env {
		if err := os.Setenv(k, v); err != nil {
			return nil, invalid(fmt.Errorf("load: env %s: %w", k, err))
		}
	}
	if req.MemoryCapBytes > math.MaxInt64 {
		return nil, invalid(fmt.Errorf("load: memory cap %d too large", req.MemoryCapBytes))
	}
	rt, err := runtime.New(runtime.Options{MemoryCap: int64(req.MemoryCapBytes), OpObserver: w.observe,
		OpFault: func(e runtime.OpEvent) error { // oom_at_op fails that op itself
			return w.inj.Load().OpErr(e.Seq, e.OutBytes, e.Bytes, e.Cap)
		}})
	if err != nil {
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	enc, err := LoadEncoder(rt, SnapshotPaths(req.ModelDir), wdt)
	if err != nil {
		rt.Close()
		if !errors.As(err, new(*runtime.OOMError)) {
			// A snapshot that cannot be read, parsed or bound will not load on a retry either.
			return nil, invalid(fmt.Errorf("load %s: %w", req.ModelDir, err))
		}
		return nil, classify(fmt.Errorf("load %s: %w", req.ModelDir, err))
	}
	loadTime := time.Since(start)
	w.mu.Lock()
	w.rt, w.enc, w.loadTime = rt, enc, loadTime
	w.mu.Unlock()
	w.logReport(enc)
	w.log.WithFields(logrus.Fields{"dtype": req.DType, "weights": wdt.String(), "compute": "fp32"}).Info("weight dtype")
	mem := rt.Memory()
	w.k.Beacon.SetBytes(int64(mem.Allocated))
	info := rt.Backend()
	return &workerkit.LoadResponse{
		Backend: info.Name, DType: "fp32",
		Device:               &workerkit.Device{Index: uint32(info.Device), Name: info.DeviceName, TotalMemoryBytes: info.DeviceMemory},
		WeightBytes:          uint64(enc.WeightBytes()),
		DeviceAllocatedBytes: mem.Allocated,
		LoadDuration:         loadTime,
		TextEncoder:          textEncoderInfo(enc),
	}, nil
}

// textEncoderInfo is the encoders' constants as LoadResponse reports them to the supervisor.
func textEncoderInfo(enc *Encoder) *workerkit.TextEncoderInfo {
	u := func(n int) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }
	return &workerkit.TextEncoderInfo{
		LlamaHiddenSize:            u(enc.Llama.Config.HiddenSize),
		ClipHiddenSize:             u(enc.CLIP.Config.HiddenSize),
		LlamaMaxPositionEmbeddings: u(enc.Llama.Config.MaxPositionEmbeddings),
		ClipMaxPositionEmbeddings:  u(enc.CLIP.Config.MaxPositionEmbeddings),
		TemplatePrefixTokens:       u(enc.TemplatePrefix),
	}
}

func (w *worker) logReport(enc *Encoder) {
	for _, r := range []struct {
		model string
		rep   nn.Report
	}{{"text_encoder", enc.Llama.Report}, {"text_encoder_2", enc.CLIP.Report}} {
		log := w.log.WithFields(logrus.Fields{"model": r.model, "tensors": r.rep.Loaded, "bytes": r.rep.Bytes,
			"skipped": len(r.rep.Skipped)})
		log.Info("model loaded")
		for _, n := range r.rep.Unexpected {
			w.log.WithFields(logrus.Fields{"model": r.model, "tensor": n}).Warn("unexpected tensor in checkpoint")
		}
	}
	w.log.WithFields(logrus.Fields{"layers_computed": enc.Llama.Plan.Layers, "num_hidden_layers": enc.Llama.Config.NumHiddenLayers,
		"hidden_state": enc.Llama.Plan.HiddenStateIndex}).Info("llama plan")
	if enc.TemplatePrefix != DefaultCropStart {
		w.log.WithFields(logrus.Fields{"template_prefix": enc.TemplatePrefix, "crop_start": DefaultCropStart}).
			Warn("the prompt template's prefix is not crop_start tokens long with this tokenizer")
	}
}

// Run serves one text_encode stage.
func (w *worker) Run(ctx context.Context, req *workerkit.RunRequest, emit workerkit.Emit) (*workerkit.Result, error) {
	w.runMu.Lock()
	defer w.runMu.Unlock()
	enc := w.loaded()
	if enc == nil {
		return nil, invalid(errors.New("run: not loaded"))
	}
	te, ok := req.Stage.(*workerkit.TextEncodeRequest)
	if !ok {
		return nil, invalid(fmt.Errorf("run: the textenc worker runs text_encode stages, not %T", req.Stage))
	}
	start := time.Now()
	defer func() { w.computeNanos.Add(int64(time.Since(start))) }()
	log := w.log.WithField("job", req.JobID)
	res, err := w.textEncode(ctx, enc, te, emit, start)
	if err != nil {
		err = classify(fmt.Errorf("text_encode: %w", err))
		log.WithError(err).Warn("stage failed")
		return nil, err
	}
	log.WithField("elapsed", time.Since(start)).Info("stage done")
	return res, nil
}

// outputSpec is one output of a stage: where it goes and what it holds.
type outputSpec struct {
	ref   workerkit.TensorRef
	field string
	data  []byte
	dtype safetensors.DType
	shape []int64
}

// loaded returns the encoder once Load has succeeded (nil before).
func (w *worker) loaded() *Encoder {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.enc
}

func (w *worker) textEncode(ctx context.Context, enc *Encoder, req *workerkit.TextEncodeRequest, emit workerkit.Emit, start time.Time) (*workerkit.Result, error) {
	refs := []struct {
		field string
		ref   workerkit.TensorRef
	}{{"llama_vec", req.LlamaVec}, {"llama_mask", req.LlamaMask}, {"clip_pooler", req.ClipPooler},
		{"llama_vec_n", req.LlamaVecN}, {"llama_mask_n", req.LlamaMaskN}, {"clip_pooler_n", req.ClipPoolerN}}
	for _, r := range refs {
		if err := checkOutputRef(r.field, r.ref); err != nil {
			return nil, err
		}
	}
	if err := checkTokenRefs(req); err != nil {
		return nil, err
	}
	if math.IsNaN(float64(req.CFG)) || math.IsInf(float64(req.CFG), 0) {
		return nil, fmt.Errorf("%w: cfg %v", ErrInvalidArgument, req.CFG)
	}
	p, err := enc.withDefaults(Params{LlamaMaxLength: int(req.LlamaMaxLength), CLIPMaxLength: int(req.ClipMaxLength),
		CropStart: int(req.CropStart), PadLength: int(req.PadLength)})
	if err != nil {
		return nil, err
	}
	progress := func(phase string, step, total uint32) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := w.inj.Load().Err(); err != nil {
			return err // injected out of memory (a test fault)
		}
		if emit == nil {
			return nil
		}
		return emit(&workerkit.Progress{Phase: phase, Step: step, TotalSteps: total, Elapsed: time.Since(start)})
	}
	total := uint32(2)
	if req.CFG == 1 {
		total = 1
	}
	if err := progress("encode_prompt", 0, total); err != nil {
		return nil, err
	}
	w.k.Beacon.SetStep(1, int(total))
	pos, err := enc.Encode(req.Prompt, p)
	if err != nil {
		return nil, fmt.Errorf("prompt: %w", err)
	}
	w.k.Beacon.SetBytes(int64(w.memory().Allocated))
	if err := progress("encode_prompt", 1, total); err != nil {
		return nil, err
	}
	var neg Conds
	if req.CFG == 1 {
		neg = ZeroNegative(pos) // demo_gradio.py: torch.zeros_like, negative prompt not encoded
	} else {
		w.k.Beacon.SetStep(2, int(total))
		if neg, err = enc.Encode(req.NegativePrompt, p); err != nil {
			return nil, fmt.Errorf("negative prompt: %w", err)
		}
		if err := progress("encode_negative", 2, total); err != nil {
			return nil, err
		}
	}
	w.k.Beacon.SetStep(0, 0)
	if err := progress("write", 0, 0); err != nil {
		return nil, err
	}
	pad := int64(len(pos.LlamaMask))
	hidden := int64(enc.Llama.Config.HiddenSize)
	clipHidden := int64(enc.CLIP.Config.HiddenSize)
	outs := make([]outputSpec, 0, len(refs))
	for i, c := range []Conds{pos, neg} {
		vec, err := floatOutput(refs[3*i].field, refs[3*i].ref, c.LlamaVec, []int64{1, pad, hidden})
		if err != nil {
			return nil, err
		}
		mask, err := maskOutput(refs[3*i+1].field, refs[3*i+1].ref, c.LlamaMask, []int64{1, pad})
		if err != nil {
			return nil, err
		}
		pool, err := floatOutput(refs[3*i+2].field, refs[3*i+2].ref, c.CLIPPooler, []int64{1, clipHidden})
		if err != nil {
			return nil, err
		}
		outs = append(outs, vec, mask, pool)
	}
	toks, err := tokenOutputs(req, pos.Tokens) // optional, after the six
	if err != nil {
		return nil, err
	}
	outs = append(outs, toks...)
	written, err := writeOutputs(outs)
	if err != nil {
		return nil, err
	}
	return &workerkit.Result{Outputs: written, Stats: w.stats()}, nil
}

// checkOutputRef checks that an output names a tensor in an absolute, complete-segment path.
func checkOutputRef(field string, r workerkit.TensorRef) error {
	switch {
	case r.Path == "" || r.Name == "":
		return fmt.Errorf("%w: %s: path and name are required", ErrInvalidArgument, field)
	case !filepath.IsAbs(r.Path):
		return fmt.Errorf("%w: %s: path %q is not absolute", ErrInvalidArgument, field, r.Path)
	case strings.HasSuffix(r.Path, shm.PartialExt):
		return fmt.Errorf("%w: %s: path %q names a partial file", ErrInvalidArgument, field, r.Path)
	}
	return nil
}

func checkShape(field string, r workerkit.TensorRef, shape []int64) error {
	if len(r.Shape) == 0 {
		return nil
	}
	if len(r.Shape) != len(shape) {
		return fmt.Errorf("%w: %s: shape %v asked, the output is %v", ErrInvalidArgument, field, r.Shape, shape)
	}
	for i := range shape {
		if r.Shape[i] != shape[i] {
			return fmt.Errorf("%w: %s: shape %v asked, the output is %v", ErrInvalidArgument, field, r.Shape, shape)
		}
	}
	return nil
}

// floatOutput encodes v as the dtype r asks for (F32 by default, F16 or BF16).
func floatOutput(field string, r workerkit.TensorRef, v []float32, shape []int64) (outputSpec, error) {
	if err := checkShape(field, r, shape); err != nil {
		return outputSpec{}, err
	}
	dt := r.DType
	if dt == "" {
		dt = safetensors.F32
	}
	var data []byte
	switch dt {
	case safetensors.F32:
		data = safetensors.FromFloat32("", nil, v).Data
	case safetensors.F16, safetensors.BF16:
		data = make([]byte, 2*len(v))
		for i, x := range v {
			h := safetensors.F32ToF16(x)
			if dt == safetensors.BF16 {
				h = safetensors.F32ToBF16(x)
			}
			data[2*i], data[2*i+1] = byte(h), byte(h>>8)
		}
	default:
		return outputSpec{}, fmt.Errorf("%w: %s: dtype %s (F32, F16 or BF16)", ErrInvalidArgument, field, dt)
	}
	return outputSpec{ref: r, field: field, data: data, dtype: dt, shape: shape}, nil
}

// maskOutput encodes a mask as BOOL (the default) or U8.
func maskOutput(field string, r workerkit.TensorRef, m []bool, shape []int64) (outputSpec, error) {
	if err := checkShape(field, r, shape); err != nil {
		return outputSpec{}, err
	}
	dt := r.DType
	if dt == "" {
		dt = safetensors.Bool
	}
	if dt != safetensors.Bool && dt != safetensors.U8 {
		return outputSpec{}, fmt.Errorf("%w: %s: dtype %s (BOOL or U8)", ErrInvalidArgument, field, dt)
	}
	data := make([]byte, len(m))
	for i, b := range m {
		if b {
			data[i] = 1
		}
	}
	return outputSpec{ref: r, field: field, data: data, dtype: dt, shape: shape}, nil
}

// writeOutputs writes the outputs into their segments (outputs sharing a path share a file) and
// returns their refs as written, in order.
func writeOutputs(outs []outputSpec) ([]workerkit.TensorRef, error) {
	var paths []string
	byPath := map[string][]outputSpec{}
	for _, o := range outs {
		if _, ok := byPath[o.ref.Path]; !ok {
			paths = append(paths, o.ref.Path)
		}
		for _, prev := range byPath[o.ref.Path] {
			if prev.ref.Name == o.ref.Name {
				return nil, fmt.Errorf("%w: %s and %s both name tensor %q of %s", ErrInvalidArgument, prev.field, o.field, o.ref.Name, o.ref.Path)
			}
		}
		byPath[o.ref.Path] = append(byPath[o.ref.Path], o)
	}
	for _, path := range paths {
		group := byPath[path]
		ts := make([]safetensors.Tensor, len(group))
		for i, o := range group {
			ts[i] = safetensors.Tensor{Name: o.ref.Name, DType: o.dtype, Shape: o.shape, Data: o.data}
		}
		if _, err := shm.WriteSegment(path, ts); err != nil {
			return nil, fmt.Errorf("write outputs: %w", err)
		}
	}
	written := make([]workerkit.TensorRef, len(outs))
	for i, o := range outs {
		written[i] = workerkit.TensorRef{Path: o.ref.Path, Name: o.ref.Name, DType: o.dtype, Shape: o.shape}
	}
	return written, nil
}

// Stats reports the runtime's memory, op counts and timings.
func (w *worker) Stats(ctx context.Context) (*workerkit.Stats, error) {
	return w.stats(), nil
}

// stats builds the counters.
func (w *worker) stats() *workerkit.Stats {
	w.mu.Lock()
	loadTime := w.loadTime
	w.mu.Unlock()
	st := &workerkit.Stats{LoadTime: loadTime, ComputeTime: time.Duration(w.computeNanos.Load()), OpCounts: map[string]uint64{}}
	m := w.memory()
	st.AllocatorCurrentBytes, st.AllocatorPeakBytes, st.MemoryCapBytes = m.Allocated, m.Peak, m.Cap
	st.HostRSSBytes = hostRSS()
	w.opsMu.Lock()
	for k, v := range w.ops {
		st.OpCounts[k] = v
	}
	w.opsMu.Unlock()
	return st
}

// memory returns the runtime's accounting (zero before Load).
func (w *worker) memory() runtime.MemoryStats {
	w.mu.Lock()
	rt := w.rt
	w.mu.Unlock()
	if rt == nil {
		return runtime.MemoryStats{}
	}
	return rt.Memory()
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
	return nil, invalid(errors.New("probe: the textenc worker does not probe devices"))
}
