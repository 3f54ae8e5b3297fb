// Package samplertest drives the sampler fixture's sample_hunyuan cases against a real Model.
// The transformer package's parity test calls RunParityCase once its model exists; the sampler
// package itself checks the schedule and replays the UniPC steps without a transformer.
package samplertest

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/torchrng"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
)

// OpSampleHunyuan is the fixture op RunParityCase handles.
const OpSampleHunyuan = "sampler.sample_hunyuan"

// Case is a sample_hunyuan fixture case decoded into a sampler request.
type Case struct {
	Request sampler.Request
	// Seed is the case's seed; Noise is checked against torch.randn on it.
	Seed int64
	// TeaCacheRelL1 is the reference transformer's accumulated TeaCache distance after each
	// transformer call (0 where it computed the blocks), for models that report theirs.
	TeaCacheRelL1 []float64
	// Steps lists the step indices with recorded x and denoised outputs.
	Steps []int
}

type params struct {
	Seed          int64     `json:"seed"`
	Steps         int       `json:"steps"`
	CFG           float64   `json:"cfg"`
	GS            float64   `json:"gs"`
	RS            float64   `json:"rs"`
	Width         int       `json:"width"`
	Height        int       `json:"height"`
	Frames        int       `json:"frames"`
	Sampler       string    `json:"sampler"`
	Variant       string    `json:"variant"`
	TeaCache      bool      `json:"teacache"`
	Shift         float64   `json:"shift"`
	DType         string    `json:"dtype"`
	TeaCacheRelL1 []float64 `json:"transformer_calls_accumulated_rel_l1"`
}

var knownParams = []string{"seed", "steps", "cfg", "gs", "rs", "width", "height", "frames", "sampler",
	"variant", "teacache", "shift", "dtype", "transformer_calls_accumulated_rel_l1"}

// Decode reads a sample_hunyuan case: its params, conditioning tensors and noise. The model
// dtype is the case's "dtype" param when present, else float64 (the fixtures' stated precision:
// the transformer ran in float64, so nothing was rounded to bf16).
func Decode(t testing.TB, c parity.Case) Case {
	t.Helper()
	if c.Op != OpSampleHunyuan {
		t.Fatalf("case %s: op %q, want %q", c.Name, c.Op, OpSampleHunyuan)
	}
	for name := range c.Params {
		if !slices.Contains(knownParams, name) {
			t.Fatalf("case %s: unhandled param %q", c.Name, name)
		}
	}
	raw, err := json.Marshal(c.Params)
	if err != nil {
		t.Fatal(err)
	}
	p := params{Sampler: "unipc", Variant: "bh1", CFG: 1, DType: "float64"}
	if err := json.Unmarshal(raw, &p); err != nil {
		t.Fatalf("case %s: params: %v", c.Name, err)
	}
	if p.Sampler != "unipc" {
		t.Fatalf("case %s: sampler %q is not supported", c.Name, p.Sampler)
	}
	variant, err := sampler.ParseVariant(p.Variant)
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	dtype, err := sampler.ParseDType(p.DType)
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}

	pos := &sampler.Conditioning{
		EncoderHiddenStates:  floatInput(t, c, "encoder_hidden_states"),
		EncoderAttentionMask: intInput(t, c, "encoder_attention_mask"),
		PooledProjections:    floatInput(t, c, "pooled_projections"),
		ImageEmbeddings:      floatInput(t, c, "image_embeddings"),
		LatentIndices:        intInput(t, c, "latent_indices"),
		CleanLatents:         floatInput(t, c, "clean_latents"),
		CleanLatentIndices:   intInput(t, c, "clean_latent_indices"),
		CleanLatents2x:       floatInput(t, c, "clean_latents_2x"),
		CleanLatent2xIndices: intInput(t, c, "clean_latent_2x_indices"),
		CleanLatents4x:       floatInput(t, c, "clean_latents_4x"),
		CleanLatent4xIndices: intInput(t, c, "clean_latent_4x_indices"),
	}
	var neg *sampler.Conditioning
	if c.HasInput("negative_prompt_embeds") {
		n := *pos
		n.EncoderHiddenStates = floatInput(t, c, "negative_prompt_embeds")
		n.EncoderAttentionMask = intInput(t, c, "negative_prompt_embeds_mask")
		n.PooledProjections = floatInput(t, c, "negative_prompt_poolers")
		neg = &n
	}
	batch := 1
	if len(pos.EncoderHiddenStates.Shape) > 0 {
		batch = pos.EncoderHiddenStates.Shape[0]
	}
	shape := sampler.LatentShape(batch, p.Width, p.Height, p.Frames)
	noise := c.Input(t, "noise")
	if !slices.Equal(noise.Shape, toInt64(shape.Ints())) {
		t.Fatalf("case %s: noise shape %v, want %v from the params", c.Name, noise.Shape, shape)
	}

	opts := sampler.Options{
		Steps:    p.Steps,
		Shift:    p.Shift,
		Guidance: sampler.Guidance{Distilled: p.GS, CFG: p.CFG, Rescale: p.RS},
		Variant:  variant,
		DType:    dtype,
		TeaCache: p.TeaCache,
	}
	var steps []int
	for i := 0; i < p.Steps; i++ {
		if c.HasOutput(fmt.Sprintf("step%d_x", i)) {
			steps = append(steps, i)
		}
	}
	for name := range c.Outputs {
		if name != "result" && !strings.HasPrefix(name, "step") {
			t.Fatalf("case %s: unhandled output %q", c.Name, name)
		}
	}
	return Case{
		Request:       sampler.Request{Noise: noise.F32, Shape: shape, Positive: pos, Negative: neg, Options: opts},
		Seed:          p.Seed,
		TeaCacheRelL1: p.TeaCacheRelL1,
		Steps:         steps,
	}
}

// CheckNoise asserts that the case's noise is torch.randn(shape) on its seed, bit for bit.
func CheckNoise(t testing.TB, c parity.Case, d Case) {
	t.Helper()
	want, err := torchrng.New(torchrng.SeedFromInt(d.Seed)).Randn(d.Request.Shape.Ints())
	if err != nil {
		t.Fatal(err)
	}
	mismatches := 0
	for i, v := range d.Request.Noise {
		if math.Float32bits(v) != math.Float32bits(want[i]) {
			mismatches++
		}
	}
	t.Logf("case %s noise: torchrng seed %d, mismatches=%d of %d (bit-exact)", c.Name, d.Seed, mismatches, len(want))
	if mismatches != 0 {
		t.Errorf("case %s: noise differs from torchrng.Randn in %d values", c.Name, mismatches)
	}
}

// RunParityCase runs one sample_hunyuan case through sampler.Sample with model and checks the
// result and every recorded step's x and denoised against the case's tolerance, logging one line
// per output. model must be the fixture's transformer (the case's "models" entry); it gets
// InitializeTeaCache when it implements sampler.TeaCacheModel.
func RunParityCase(t *testing.T, c parity.Case, model sampler.Model) {
	t.Helper()
	d := Decode(t, c)
	CheckNoise(t, c, d)
	n := d.Request.Shape.Numel()
	xs := make(map[int][]float32)
	dens := make(map[int][]float32)
	req := d.Request
	req.OnStep = func(s sampler.StepInfo) error {
		xs[s.Step] = slices.Clone(s.X)
		dens[s.Step] = slices.Clone(s.Denoised)
		return nil
	}
	ctx := context.Background()
	if dl, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, dl)
		defer cancel()
	}
	out, err := sampler.Sample(ctx, model, req)
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	shape := toInt64(d.Request.Shape.Ints())
	if len(out) != n {
		t.Fatalf("case %s: result has %d values, want %d", c.Name, len(out), n)
	}
	for _, i := range d.Steps {
		c.Check(t, fmt.Sprintf("step%d_x", i), xs[i], shape, c.Output(t, fmt.Sprintf("step%d_x", i)))
		if c.HasOutput(fmt.Sprintf("step%d_denoised", i)) {
			c.Check(t, fmt.Sprintf("step%d_denoised", i), dens[i], shape, c.Output(t, fmt.Sprintf("step%d_denoised", i)))
		}
	}
	c.Check(t, "result", out, shape, c.Output(t, "result"))
	if len(d.TeaCacheRelL1) > 0 {
		t.Logf("case %s: reference TeaCache accumulated rel_l1 per transformer call %v", c.Name, d.TeaCacheRelL1)
	}
}

func floatInput(t testing.TB, c parity.Case, name string) conditioning.Tensor {
	t.Helper()
	if !c.HasInput(name) {
		return conditioning.Tensor{}
	}
	a := c.Input(t, name)
	return conditioning.Tensor{Shape: toInt(a.Shape), Data: a.F32}
}

func intInput(t testing.TB, c parity.Case, name string) conditioning.IntTensor {
	t.Helper()
	if !c.HasInput(name) {
		return conditioning.IntTensor{}
	}
	a := c.Input(t, name)
	if a.Ints == nil {
		t.Fatalf("case %s: input %q is %s, want an integer tensor", c.Name, name, a.DType)
	}
	return conditioning.IntTensor{Shape: toInt(a.Shape), Data: a.Ints}
}

func toInt(s []int64) []int {
	out := make([]int, len(s))
	for i, v := range s {
		out[i] = int(v)
	}
	return out
}

func toInt64(s []int) []int64 {
	out := make([]int64, len(s))
	for i, v := range s {
		out[i] = int64(v)
	}
	return out
}
