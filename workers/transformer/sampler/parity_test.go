package sampler_test

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
	"github.com/framepackd/framepackd/workers/transformer/sampler/samplertest"
)

// replayTol bounds the replayed UniPC steps: the reference's own float32 arithmetic, reproduced
// operation by operation, differs from ours only in last-bit rounding (libm, BLAS).
const replayTol = 1e-5

// TestParitySampler checks every case of the sampler fixture by op. sample_hunyuan cases need
// the real transformer: here their UniPC arithmetic is replayed from the recorded data
// predictions (every step's x follows from the previous x and the recorded denoised values),
// and the full run is left to the transformer package (samplertest.RunParityCase).
func TestParitySampler(t *testing.T) {
	fx := parity.Load(t, "sampler")
	if len(fx.Cases) == 0 {
		t.Fatal("sampler fixture has no cases")
	}
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case "sampler.sigmas":
				checkSigmas(t, c)
			case samplertest.OpSampleHunyuan:
				t.Run("unipc_replay", func(t *testing.T) { replayUniPC(t, c) })
				t.Run("transformer", func(t *testing.T) {
					t.Skipf("case %s: needs workers/transformer model (its test calls samplertest.RunParityCase)", c.Name)
				})
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
		})
	}
}

func checkSigmas(t *testing.T, c parity.Case) {
	var seqLen, steps int
	c.InputValue(t, "seq_length", &seqLen)
	c.InputValue(t, "steps", &steps)
	mu := sampler.FluxMu(seqLen)
	var refMu float64
	if c.Param(t, "mu", &refMu) {
		if math.Abs(mu-refMu) > 1e-12 {
			t.Errorf("case %s: mu %.17g, reference %.17g", c.Name, mu, refMu)
		}
	}
	for name := range c.Params {
		if name != "mu" {
			t.Fatalf("case %s: unhandled param %q", c.Name, name)
		}
	}
	got, err := sampler.Sigmas(steps, mu)
	if err != nil {
		t.Fatal(err)
	}
	want := c.Output(t, "sigmas")
	bits := 0
	for i := range want.F32 {
		if i < len(got) && math.Float32bits(got[i]) != math.Float32bits(want.F32[i]) {
			bits++
		}
	}
	t.Logf("case %s: mu=%.10g, %d of %d sigmas differ in their bits", c.Name, mu, bits, len(want.F32))
	c.Check(t, "sigmas", got, []int64{int64(len(got))}, want)
	if got[len(got)-1] != 0 {
		t.Errorf("case %s: last sigma %v, want 0", c.Name, got[len(got)-1])
	}
}

// replayUniPC runs sampler.UniPC with a denoiser that returns the reference's recorded data
// prediction for each step, and compares every step's x with the reference's.
func replayUniPC(t *testing.T, c parity.Case) {
	d := samplertest.Decode(t, c)
	samplertest.CheckNoise(t, c, d)
	plan, err := sampler.PlanFor(d.Request.Shape, d.Request.Options)
	if err != nil {
		t.Fatal(err)
	}
	steps := d.Request.Steps
	recorded := make([][]float32, steps)
	for i := range recorded {
		name := fmt.Sprintf("step%d_denoised", i)
		if !c.HasOutput(name) {
			t.Fatalf("case %s: no %s to replay", c.Name, name)
		}
		recorded[i] = c.Output(t, name).F32
	}
	calls := 0
	replay := func(_ context.Context, x []float32, sigma float32, step int) ([]float32, error) {
		calls++
		if sigma != plan.Sigmas[step] {
			return nil, fmt.Errorf("step %d evaluated at sigma %v, want %v", step, sigma, plan.Sigmas[step])
		}
		return append([]float32(nil), recorded[step]...), nil
	}
	xs := make([][]float32, steps)
	out, err := sampler.UniPC(t.Context(), replay, d.Request.Noise, plan.Sigmas, d.Request.Variant, func(s sampler.StepInfo) error {
		xs[s.Step] = append([]float32(nil), s.X...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if calls != steps {
		t.Errorf("case %s: %d model evaluations, want one per step (%d)", c.Name, calls, steps)
	}
	shape := []int64{int64(d.Request.Shape.B()), int64(d.Request.Shape.C()), int64(d.Request.Shape.T()), int64(d.Request.Shape.H()), int64(d.Request.Shape.W())}
	t.Logf("case %s: seq_length=%d mu=%.6g order=%d variant=%v steps=%d", c.Name, plan.SeqLength, plan.Mu, plan.Order, d.Request.Variant, steps)
	for i := 0; i < steps; i++ {
		c.CheckTol(t, fmt.Sprintf("replay step%d_x", i), xs[i], shape, c.Output(t, fmt.Sprintf("step%d_x", i)), replayTol)
	}
	c.CheckTol(t, "replay result", out, shape, c.Output(t, "result"), replayTol)
}
