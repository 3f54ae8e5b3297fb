package main

import (
	"context"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/shm/shmtest"
	"github.com/framepackd/framepackd/internal/tokenizer"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/workertest"
)

// loadEncoder loads the encoder in this process (for the ids checks and the in-process test).
func loadEncoder(t *testing.T, dir string) *Encoder {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	enc, err := LoadEncoder(rt, SnapshotPaths(dir), runtime.F32)
	if err != nil {
		rt.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		enc.Close()
		if m := rt.Memory(); m.LiveTensors != 0 {
			t.Errorf("leak: %d tensors (%d bytes) still held", m.LiveTensors, m.Allocated)
		}
		rt.Close()
	})
	return enc
}

func mismatches(got, want []int64) int {
	n := max(len(got), len(want)) - min(len(got), len(want))
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			n++
		}
	}
	return n
}

func boolsToInts(b []bool) []int64 {
	v := make([]int64, len(b))
	for i, x := range b {
		if x {
			v[i] = 1
		}
	}
	return v
}

func count(v []int64) int {
	n := 0
	for _, x := range v {
		if x != 0 {
			n++
		}
	}
	return n
}

func allZero(v []float32) bool {
	for _, x := range v {
		if x != 0 {
			return false
		}
	}
	return true
}

// encodeParams reads a textenc.encode_prompt_conds case's lengths.
func encodeParams(t *testing.T, c parity.Case) Params {
	t.Helper()
	var index, cropStart, padLength int
	if !c.Param(t, "hidden_state_index", &index) || !c.Param(t, "crop_start", &cropStart) || !c.Param(t, "pad_length", &padLength) {
		t.Fatalf("case %s: params hidden_state_index, crop_start and pad_length are required", c.Name)
	}
	if index != LlamaHiddenStateIndex {
		t.Fatalf("case %s: hidden_state_index %d; the worker computes FramePack's %d", c.Name, index, LlamaHiddenStateIndex)
	}
	llamaIDs := c.Input(t, "llama_ids")
	clipIDs := c.Input(t, "clip_ids")
	return Params{LlamaMaxLength: len(llamaIDs.Ints) - cropStart, CLIPMaxLength: len(clipIDs.Ints),
		CropStart: cropStart, PadLength: padLength}
}

func stageRequest(prompt, negative string, cfg float32, p Params) workerkit.TextEncodeRequest {
	return workerkit.TextEncodeRequest{Prompt: prompt, NegativePrompt: negative, CFG: cfg,
		LlamaMaxLength: uint32(p.LlamaMaxLength), ClipMaxLength: uint32(p.CLIPMaxLength),
		CropStart: uint32(p.CropStart), PadLength: uint32(p.PadLength)}
}

// checkEncodeOutputs compares one side (positive or negative) of a stage with case c's outputs.
func checkEncodeOutputs(t *testing.T, c parity.Case, label string, vec []float32, vecShape []int64, mask []int64,
	pooler []float32, poolerShape []int64) {
	t.Helper()
	want := c.Output(t, "llama_vec")
	rows, hidden := want.Shape[1], want.Shape[2]
	if int64(count(mask)) != rows {
		t.Errorf("case %s %s: mask marks %d rows, llama_vec has %d", c.Name, label, count(mask), rows)
	}
	c.Check(t, label+"llama_vec", vec[:rows*hidden], []int64{1, rows, hidden}, want)
	c.Check(t, label+"clip_pooler", pooler, poolerShape, c.Output(t, "clip_pooler"))
	c.Check(t, label+"llama_vec_padded", vec, vecShape, c.Output(t, "llama_vec_padded"))
	wantMask := c.Output(t, "llama_mask_padded")
	m := mismatches(mask, wantMask.Ints)
	t.Logf("case %s %sllama_mask_padded: mismatches=%d tol=0", c.Name, label, m)
	if m != 0 {
		t.Errorf("case %s %sllama_mask_padded: %d mismatches", c.Name, label, m)
	}
}

// TestParityTextenc checks every case of the textenc fixture through the real worker process
// and shared memory: tokenize (ids and masks exact, in process with the worker's tokenizer code,
// and through the worker: its optional token outputs exact, and its outputs for the prompt equal
// the models' outputs for the reference ids) and textenc.encode_prompt_conds (llama_vec, clip_pooler and the padded outputs
// within the case's rel_l2; the zero negative at cfg 1; the negative prompt encoded otherwise).
func TestParityTextenc(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	p, resp := loadWorker(t, dir)
	half := workertest.HalfActivations(t, resp)
	a := shmtest.Arena(t, "job")
	enc := loadEncoder(t, dir)
	var encodeCases []parity.Case
	checked := 0
	for _, c := range fx.Cases {
		c = c.ForActivations(half)
		switch c.Op {
		case "tokenize":
			checkTokenizeCase(t, enc, p, a, c, half)
		case "textenc.encode_prompt_conds":
			checkEncodeCase(t, p, a, c)
			encodeCases = append(encodeCases, c)
		default:
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
			continue
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("the textenc fixture has no cases")
	}
	// The negative prompt: each encode case's prompt as the negative of the previous one.
	for i, c := range encodeCases {
		if len(encodeCases) < 2 {
			break
		}
		n := encodeCases[(i+1)%len(encodeCases)]
		pp, np := encodeParams(t, c), encodeParams(t, n)
		if pp != np {
			continue
		}
		var prompt, negative string
		c.InputValue(t, "prompt", &prompt)
		n.InputValue(t, "prompt", &negative)
		o, _ := runStage(t, p, a, stageRequest(prompt, negative, 7.5, pp))
		checkEncodeOutputs(t, c, "cfg7.5 ", o.LlamaVec, o.LlamaVecShape, o.LlamaMask, o.ClipPooler, o.ClipPoolerShape)
		checkEncodeOutputs(t, n, "as negative ", o.LlamaVecN, o.LlamaVecShape, o.LlamaMaskN, o.ClipPoolerN, o.ClipPoolerShape)
	}
}

// TestParityTextencHalfWeights runs the textenc fixture through a worker that keeps the weight
// matrices in the checkpoints' own dtype (Load dtype "auto": the fixture's fp16): every
// encode_prompt_conds case within its rel_l2, as in fp32 (fp16 widens to f32 exactly), with the
// weights in about half the bytes.
func TestParityTextencHalfWeights(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	f32Bytes := loadEncoder(t, dir).WeightBytes()
	p, _ := workertest.Start(t, "textenc")
	ctx, cancel := context.WithTimeout(t.Context(), workertest.CallTimeout)
	defer cancel()
	resp, err := p.Load(ctx, &workerkit.LoadRequest{ModelDir: dir, Backend: workertest.Backend(), DType: "auto"})
	if err != nil {
		t.Fatalf("load dtype auto: %v", err)
	}
	t.Logf("weights: %d bytes as stored, %d in f32", resp.WeightBytes, f32Bytes)
	if resp.WeightBytes == 0 || float64(resp.WeightBytes) > 0.6*float64(f32Bytes) {
		t.Errorf("weights as stored take %d bytes, f32 %d: want about half", resp.WeightBytes, f32Bytes)
	}
	a := shmtest.Arena(t, "job")
	checked := 0
	for _, c := range fx.Cases {
		switch c.Op {
		case "tokenize":
			t.Logf("case %s: tokenize does not read weights (TestParityTextenc checks it)", c.Name)
		case "textenc.encode_prompt_conds":
			checkEncodeCase(t, p, a, c)
			checked++
		default:
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
		}
	}
	if checked == 0 {
		t.Fatal("the textenc fixture has no textenc.encode_prompt_conds case")
	}
}

func checkEncodeCase(t *testing.T, p *workerkit.Process, a *shm.Arena, c parity.Case) {
	t.Helper()
	params := encodeParams(t, c)
	var prompt string
	c.InputValue(t, "prompt", &prompt)
	o, events := runStage(t, p, a, stageRequest(prompt, "not encoded at cfg 1", 1, params))
	if len(events) == 0 {
		t.Errorf("case %s: no progress events", c.Name)
	}
	checkEncodeOutputs(t, c, "", o.LlamaVec, o.LlamaVecShape, o.LlamaMask, o.ClipPooler, o.ClipPoolerShape)
	// cfg 1: zeros_like(llama_vec) padded by crop_or_pad_yield_mask, so the mask is the positive's.
	if !allZero(o.LlamaVecN) || !allZero(o.ClipPoolerN) || mismatches(o.LlamaMaskN, o.LlamaMask) != 0 {
		t.Errorf("case %s: cfg 1 negative is not zeros with the positive's mask", c.Name)
	}
	if len(o.LlamaVecN) != len(o.LlamaVec) || len(o.ClipPoolerN) != len(o.ClipPooler) {
		t.Errorf("case %s: cfg 1 negative shapes differ from the positive's", c.Name)
	}
}

// half says the worker's activations are 16-bit (the in-process encoder's are f32): its outputs
// then agree with the reference ids' within parity.HalfRelL2 instead of 1e-5.
func checkTokenizeCase(t *testing.T, enc *Encoder, p *workerkit.Process, a *shm.Arena, c parity.Case, half bool) {
	t.Helper()
	var prompt, template string
	var llamaMax, clipMax int
	if !c.Param(t, "llama_template", &template) || !c.Param(t, "llama_max_length", &llamaMax) ||
		!c.Param(t, "clip_max_length", &clipMax) {
		t.Fatalf("case %s: params llama_template, llama_max_length and clip_max_length are required", c.Name)
	}
	if template != tokenizer.HunyuanTemplate {
		t.Fatalf("case %s: the worker applies HunyuanVideo's template only", c.Name)
	}
	c.InputValue(t, "prompt", &prompt)
	params := Params{LlamaMaxLength: llamaMax - DefaultCropStart, CLIPMaxLength: clipMax}

	// The ids, exactly, from the tokenizer code the worker runs.
	toks, err := enc.Tokenize(prompt, params)
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	want := tokenizer.PromptTokens{LlamaIDs: c.Output(t, "llama_ids").Ints, LlamaMask: c.Output(t, "llama_mask").Ints,
		CLIPIDs: c.Output(t, "clip_ids").Ints}
	total := 0
	for _, o := range []struct {
		name      string
		got, want []int64
	}{{"llama_ids", toks.LlamaIDs, want.LlamaIDs}, {"llama_mask", toks.LlamaMask, want.LlamaMask}, {"clip_ids", toks.CLIPIDs, want.CLIPIDs}} {
		m := mismatches(o.got, o.want)
		if m != 0 {
			t.Errorf("case %s %s: %d mismatches\n got %v\nwant %v", c.Name, o.name, m, o.got, o.want)
		}
		total += m
	}

	// Through the worker: the ids and mask it reports (the optional token outputs) are the
	// reference's, exactly.
	req := stageRequest(prompt, "", 1, params)
	tokenOutputRefs(t, a, &req)
	o, _ := runStage(t, p, a, req)
	for i, x := range []struct {
		name      string
		got, want []int64
		dtype     safetensors.DType
	}{{"llama_ids", o.LlamaIDs, want.LlamaIDs, safetensors.I64}, {"llama_attention_mask", o.LlamaAttentionMask, want.LlamaMask, safetensors.U8},
		{"clip_ids", o.ClipIDs, want.CLIPIDs, safetensors.I64}} {
		m := mismatches(x.got, x.want)
		t.Logf("case %s worker %s: mismatches=%d tol=0", c.Name, x.name, m)
		if m != 0 {
			t.Errorf("case %s worker %s: %d mismatches\n got %v\nwant %v", c.Name, x.name, m, x.got, x.want)
		}
		if r := o.TokenRefs[i]; r.DType != x.dtype || !parity.SameShape(r.Shape, []int64{1, int64(len(x.want))}) {
			t.Errorf("case %s worker %s: written as %s%v, want %s[1 %d]", c.Name, x.name, r.DType, r.Shape, x.dtype, len(x.want))
		}
	}

	// And the stage's outputs for the prompt are the models' outputs for the reference ids (any
	// id that reaches a model changes them far beyond this bound).
	ref, err := enc.EncodeTokens(want, params)
	if err != nil {
		t.Fatalf("case %s: encode reference ids: %v", c.Name, err)
	}
	eVec := parity.RelL2(o.LlamaVec, ref.LlamaVec)
	ePool := parity.RelL2(o.ClipPooler, ref.CLIPPooler)
	mm := mismatches(o.LlamaMask, boolsToInts(ref.LlamaMask))
	tol := 1e-5
	if half {
		tol = parity.HalfRelL2
	}
	t.Logf("case %s: ids mismatches=%d tol=0; worker vs reference ids: llama rel_l2=%.3g clip rel_l2=%.3g mask mismatches=%d tol=%g",
		c.Name, total, eVec, ePool, mm, tol)
	if !(eVec <= tol) || !(ePool <= tol) || mm != 0 {
		t.Errorf("case %s: the worker's outputs for the prompt differ from the outputs for the reference ids", c.Name)
	}
}

// TestEncoderInProcess runs the whole encode in process on the reference ids (no tokenizer, no
// worker) and checks every output.
func TestEncoderInProcess(t *testing.T) {
	fx := parity.Load(t, "textenc")
	enc := loadEncoder(t, snapshotDir(t, fx))
	checked := 0
	for _, c := range fx.Cases {
		if c.Op != "textenc.encode_prompt_conds" {
			continue
		}
		params := encodeParams(t, c)
		toks := tokenizer.PromptTokens{LlamaIDs: c.Input(t, "llama_ids").Ints, LlamaMask: c.Input(t, "llama_mask").Ints,
			CLIPIDs: c.Input(t, "clip_ids").Ints}
		got, err := enc.EncodeTokens(toks, params)
		if err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
		hidden := int64(enc.Llama.Config.HiddenSize)
		checkEncodeOutputs(t, c, "in process ", got.LlamaVec, []int64{1, int64(params.PadLength), hidden},
			boolsToInts(got.LlamaMask), got.CLIPPooler, []int64{1, int64(len(got.CLIPPooler))})
		checked++
	}
	if checked == 0 {
		t.Fatal("the textenc fixture has no textenc.encode_prompt_conds case")
	}
}

// TestLayersComputedInWorker checks through the worker's Stats (the runtime's op counters) that
// a stage computes num_hidden_layers − 2 Llama layers per prompt and no final norm.
func TestLayersComputedInWorker(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir := snapshotDir(t, fx)
	enc := loadEncoder(t, dir) // for the configs
	L, clipLayers := enc.Llama.Config.NumHiddenLayers, enc.CLIP.Config.NumHiddenLayers
	p, resp := loadWorker(t, dir)
	a := shmtest.Arena(t, "job")
	if resp.WeightBytes == 0 || resp.Backend != workertest.Backend() {
		t.Errorf("load response %+v", resp)
	}
	// The encoders' constants, so the supervisor need not read the configs.
	wantInfo := workerkit.TextEncoderInfo{LlamaHiddenSize: uint32(enc.Llama.Config.HiddenSize), ClipHiddenSize: uint32(enc.CLIP.Config.HiddenSize),
		LlamaMaxPositionEmbeddings: uint32(enc.Llama.Config.MaxPositionEmbeddings), ClipMaxPositionEmbeddings: uint32(enc.CLIP.Config.MaxPositionEmbeddings),
		TemplatePrefixTokens: uint32(enc.TemplatePrefix)}
	if resp.TextEncoder == nil || *resp.TextEncoder != wantInfo || wantInfo.LlamaHiddenSize == 0 || wantInfo.ClipHiddenSize == 0 ||
		resp.VAE != nil || resp.Transformer != nil {
		t.Errorf("load response model info %+v, want %+v", resp.TextEncoder, wantInfo)
	}
	stats := func() map[string]uint64 {
		ctx, cancel := context.WithTimeout(t.Context(), workertest.CallTimeout)
		defer cancel()
		st, err := p.Stats(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st.OpCounts
	}
	before := stats()
	runStage(t, p, a, stageRequest("a red chair", "", 1, Params{}))
	mid := stats()
	runStage(t, p, a, stageRequest("a red chair", "blurry", 3, Params{}))
	after := stats()
	for _, s := range []struct {
		name     string
		from, to map[string]uint64
		prompts  uint64
	}{{"cfg 1", before, mid, 1}, {"cfg 3", mid, after, 2}} {
		attn := s.to["attention"] - s.from["attention"]
		rms := s.to["rms norm"] - s.from["rms norm"]
		wantAttn := s.prompts * uint64(L-2+clipLayers)
		wantRMS := s.prompts * uint64(2*(L-2))
		t.Logf("%s: %d attention ops (want %d: %d llama + %d clip layers per prompt), %d rms norms (want %d)",
			s.name, attn, wantAttn, L-2, clipLayers, rms, wantRMS)
		if attn != wantAttn || rms != wantRMS {
			t.Errorf("%s: %d attention and %d rms norm ops, want %d and %d", s.name, attn, rms, wantAttn, wantRMS)
		}
	}
	if enc.Llama.Plan.Layers != L-2 {
		t.Errorf("plan computes %d layers, want %d", enc.Llama.Plan.Layers, L-2)
	}
	if enc.Llama.Norm != nil {
		t.Error("the final norm was loaded")
	}
}

// TestCropOrPad checks crop_or_pad_yield_mask's two other branches on a fixture case: a
// pad_length below the row count keeps the first rows with an all-true mask, and a crop_start
// past the attended ids leaves no rows (zeros, all-false mask), as the reference's empty slice.
func TestCropOrPad(t *testing.T) {
	fx := parity.Load(t, "textenc")
	enc := loadEncoder(t, snapshotDir(t, fx))
	hidden := enc.Llama.Config.HiddenSize
	for _, c := range fx.Cases {
		if c.Op != "textenc.encode_prompt_conds" {
			continue
		}
		want := c.Output(t, "llama_vec")
		rows := int(want.Shape[1])
		if rows < 2 {
			continue
		}
		var prompt string
		c.InputValue(t, "prompt", &prompt)
		params := encodeParams(t, c)

		short := params
		short.PadLength = rows - 1
		got, err := enc.Encode(prompt, short)
		if err != nil {
			t.Fatal(err)
		}
		if count(boolsToInts(got.LlamaMask)) != rows-1 || len(got.LlamaVec) != (rows-1)*hidden {
			t.Errorf("case %s: pad_length %d: %d mask rows, %d values", c.Name, rows-1, count(boolsToInts(got.LlamaMask)), len(got.LlamaVec))
		}
		e := parity.RelL2(got.LlamaVec, want.F32[:(rows-1)*hidden])
		t.Logf("case %s pad_length %d (cropped): rel_l2=%.3g tol=%g", c.Name, rows-1, e, c.Tolerance.RelL2)
		if !(e <= c.Tolerance.RelL2) {
			t.Errorf("case %s: cropped rows rel_l2 %g", c.Name, e)
		}

		past := params
		past.CropStart = params.CropStart + rows + 10
		got, err = enc.Encode(prompt, past)
		if err != nil {
			t.Fatal(err)
		}
		if got.Rows != 0 || count(boolsToInts(got.LlamaMask)) != 0 || !allZero(got.LlamaVec) || allZero(got.CLIPPooler) {
			t.Errorf("case %s: crop_start past the prompt: %d rows, mask %d", c.Name, got.Rows, count(boolsToInts(got.LlamaMask)))
		}
		return
	}
	t.Fatal("no textenc.encode_prompt_conds case with two rows or more")
}
