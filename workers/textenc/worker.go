package main

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/tokenizer"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/modelrt"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
	"github.com/framepackd/framepackd/workers/textenc/llama"
)

// worker serves text_encode stages.
type worker struct {
	base *modelrt.Base
	log  *logrus.Entry

	// runMu serialises Load and Run.
	runMu sync.Mutex

	// mu protects rt and enc (set once by Load); Stats does not take it, so it answers while a
	// stage runs.
	mu  sync.Mutex
	rt  *runtime.Runtime
	enc *Encoder
}

var _ workerkit.Worker = (*worker)(nil)

func newWorker(k *workerkit.Kit) *worker {
	base := modelrt.New(k, modelrt.Config{Name: "textenc", BlockStack: "llama layers"})
	return &worker{base: base, log: base.Log}
}

// classify maps an error of loading or encoding to the worker error the supervisor acts on.
func classify(err error) error {
	return modelrt.Classify(err, nn.ErrBadInput, tokenizer.ErrInvalidPrompt)
}

// Traits declares the model's traits before a Load succeeds (workerkit.TraitsDeclarer).
func (w *worker) Traits() *workerkit.ModelTraits { return w.base.Traits() }

// Load opens the runtime of req.Backend and loads both text encoders from the snapshot folder
// req.ModelDir (text_encoder/, text_encoder_2/, tokenizer/, tokenizer_2/).
func (w *worker) Load(ctx context.Context, req *workerkit.LoadRequest) (*workerkit.LoadResponse, error) {
	w.runMu.Lock()
	defer w.runMu.Unlock()
	if w.loaded() != nil {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: already loaded")
	}
	start := time.Now()
	if req.ModelDir == "" {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "load: model_dir is required")
	}
	rt, err := w.base.Open(req)
	if err != nil {
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	// Activations in fp16 on a GPU (FramePack's text encoder dtype), fp32 on the cpu, unless the
	// request or the activation test knob says otherwise; dtype says what the weight matrices
	// are kept in ("fp16"/"bf16", or "auto": the checkpoints' own dtype).
	act, wdt, err := w.base.Activation(req, rt, llama.FramePackDType) // CLIP-L too: clip.FramePackDType is the same
	if err != nil {
		rt.Close()
		return nil, classify(fmt.Errorf("load: %w", err))
	}
	res := Residency{ActivationDType: act, WeightDType: wdt, MemoryCap: int64(min(req.MemoryCapBytes, math.MaxInt64)), MaxResidentLayers: int(req.MaxResidentBlocks)}
	enc, err := LoadEncoderWith(rt, SnapshotPaths(req.ModelDir), res)
	if err != nil {
		rt.Close()
		return nil, modelrt.ClassifyLoad(fmt.Errorf("load %s: %w", req.ModelDir, err))
	}
	w.mu.Lock()
	w.rt, w.enc = rt, enc
	w.mu.Unlock()
	resp := w.base.Loaded(rt, start, enc.WeightBytes())
	resp.TextEncoder = textEncoderInfo(enc)
	modelrt.SetResidency(resp, enc.Llama.ResidentLayers(), enc.Llama.StreamedLayers())
	w.logReport(enc)
	w.log.WithFields(logrus.Fields{"dtype": req.DType, "weights": wdt.String(), "activations": act.String()}).Info("dtypes")
	return resp, nil
}

// textEncoderInfo is the encoders' constants as LoadResponse reports them to the supervisor.
func textEncoderInfo(enc *Encoder) *workerkit.TextEncoderInfo {
	u := modelrt.Uint32
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
		log := w.log.WithFields(logrus.Fields{"model": r.model, "tensors": r.rep.Loaded, "bytes": r.rep.Bytes, "staged_bytes": r.rep.StagedBytes,
			"skipped": len(r.rep.Skipped)})
		log.Info("model loaded")
		for _, n := range r.rep.Unexpected {
			w.log.WithFields(logrus.Fields{"model": r.model, "tensor": n}).Warn("unexpected tensor in checkpoint")
		}
	}
	w.log.WithFields(logrus.Fields{"layers_computed": enc.Llama.Plan.Layers, "num_hidden_layers": enc.Llama.Config.NumHiddenLayers,
		"hidden_state": enc.Llama.Plan.HiddenStateIndex, "streamed_layers": enc.Llama.StreamedLayers(),
		"transparent_hugepages": nn.TransparentHugePages()}).Info("llama plan")
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
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "run: not loaded")
	}
	te, ok := req.Stage.(*workerkit.TextEncodeRequest)
	if !ok {
		return nil, workerkit.Errorf(workerkit.CodeInvalidArgument, "run: the textenc worker runs text_encode stages, not %T", req.Stage)
	}
	start := time.Now()
	defer w.base.AddCompute(start)
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
	for i, x := range req.ExtraPrompts {
		f := fmt.Sprintf("extra_prompts[%d].", i)
		refs = append(refs, []struct {
			field string
			ref   workerkit.TensorRef
		}{{f + "llama_vec", x.LlamaVec}, {f + "llama_mask", x.LlamaMask}, {f + "clip_pooler", x.ClipPooler}}...)
	}
	for _, r := range refs {
		if err := tensorio.CheckRef(r.field, r.ref); err != nil {
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
		if err := w.base.InjectedOOM(); err != nil {
			return err // injected out of memory (a test fault)
		}
		if emit == nil {
			return nil
		}
		return emit(&workerkit.Progress{Phase: phase, Step: step, TotalSteps: total, Elapsed: time.Since(start)})
	}
	total := uint32(2 + len(req.ExtraPrompts))
	if req.CFG == 1 {
		total--
	}
	if err := progress("encode_prompt", 0, total); err != nil {
		return nil, err
	}
	w.base.Beacon.SetStep(1, int(total))
	pos, err := enc.Encode(req.Prompt, p)
	if err != nil {
		return nil, fmt.Errorf("prompt: %w", err)
	}
	w.base.Beacon.SetBytes(int64(w.base.Memory().Allocated))
	if err := progress("encode_prompt", 1, total); err != nil {
		return nil, err
	}
	var neg Conds
	if req.CFG == 1 {
		neg = ZeroNegative(pos) // demo_gradio.py: torch.zeros_like, negative prompt not encoded
	} else {
		w.base.Beacon.SetStep(2, int(total))
		if neg, err = enc.Encode(req.NegativePrompt, p); err != nil {
			return nil, fmt.Errorf("negative prompt: %w", err)
		}
		if err := progress("encode_negative", 2, total); err != nil {
			return nil, err
		}
	}
	conds := []Conds{pos, neg}
	for i, x := range req.ExtraPrompts { // a timed prompt's other texts, with the same parameters
		step := total - uint32(len(req.ExtraPrompts)) + uint32(i) + 1
		w.base.Beacon.SetStep(int(step), int(total))
		c, err := enc.Encode(x.Prompt, p)
		if err != nil {
			return nil, fmt.Errorf("extra prompt %d: %w", i, err)
		}
		conds = append(conds, c)
		if err := progress("encode_prompt", step, total); err != nil {
			return nil, err
		}
	}
	w.base.Beacon.SetStep(0, 0)
	if err := progress("write", 0, 0); err != nil {
		return nil, err
	}
	pad := int64(len(pos.LlamaMask))
	hidden := int64(enc.Llama.Config.HiddenSize)
	clipHidden := int64(enc.CLIP.Config.HiddenSize)
	var outs encoded
	for i, c := range conds[:2] {
		if err := outs.float(refs[3*i].field, refs[3*i].ref, c.LlamaVec, []int64{1, pad, hidden}); err != nil {
			return nil, err
		}
		if err := outs.mask(refs[3*i+1].field, refs[3*i+1].ref, c.LlamaMask, []int64{1, pad}); err != nil {
			return nil, err
		}
		if err := outs.float(refs[3*i+2].field, refs[3*i+2].ref, c.CLIPPooler, []int64{1, clipHidden}); err != nil {
			return nil, err
		}
	}
	if err := outs.tokens(req, pos.Tokens); err != nil { // optional, after the six
		return nil, err
	}
	for i, c := range conds[2:] { // the extra prompts', last
		r := refs[6+3*i : 9+3*i]
		if err := outs.float(r[0].field, r[0].ref, c.LlamaVec, []int64{1, pad, hidden}); err != nil {
			return nil, err
		}
		if err := outs.mask(r[1].field, r[1].ref, c.LlamaMask, []int64{1, pad}); err != nil {
			return nil, err
		}
		if err := outs.float(r[2].field, r[2].ref, c.CLIPPooler, []int64{1, clipHidden}); err != nil {
			return nil, err
		}
	}
	written, err := tensorio.Write(outs.specs, outs.data)
	if err != nil {
		return nil, err
	}
	return &workerkit.Result{Outputs: written, Stats: w.base.Stats()}, nil
}

// encoded are a stage's outputs, encoded, in the order they are reported.
type encoded struct {
	specs []tensorio.Output
	data  [][]byte
}

func (o *encoded) add(field string, r workerkit.TensorRef, dt safetensors.DType, shape []int64, data []byte) {
	o.specs = append(o.specs, tensorio.Output{Field: field, Ref: r, DType: dt, Shape: shape})
	o.data = append(o.data, data)
}

// float adds v in the dtype r asks for (F32 by default, F16 or BF16).
func (o *encoded) float(field string, r workerkit.TensorRef, v []float32, shape []int64) error {
	dt, err := tensorio.FloatDType(field, r)
	if err != nil {
		return err
	}
	data, err := tensorio.EncodeFloat(dt, v)
	if err != nil {
		return err
	}
	o.add(field, r, dt, shape, data)
	return nil
}

// mask adds a mask as BOOL (the default) or U8.
func (o *encoded) mask(field string, r workerkit.TensorRef, m []bool, shape []int64) error {
	dt := r.DType
	if dt == "" {
		dt = safetensors.Bool
	}
	if dt != safetensors.Bool && dt != safetensors.U8 {
		return fmt.Errorf("%w: %s: dtype %s (BOOL or U8)", ErrInvalidArgument, field, dt)
	}
	data := make([]byte, len(m))
	for i, b := range m {
		if b {
			data[i] = 1
		}
	}
	o.add(field, r, dt, shape, data)
	return nil
}

// Stats reports the runtime's memory, op counts and timings.
func (w *worker) Stats(ctx context.Context) (*workerkit.Stats, error) {
	return w.base.Stats(), nil
}
