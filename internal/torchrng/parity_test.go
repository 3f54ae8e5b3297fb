package torchrng

import (
	"math"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
)

// TestParityRNG checks every case of the rng fixture bit for bit.
func TestParityRNG(t *testing.T) {
	fx := parity.Load(t, "rng")
	if len(fx.Cases) == 0 {
		t.Fatal("rng fixture has no cases")
	}
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case "rng.torch_cpu_randn":
				checkRandnCase(t, c)
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
		})
	}
}

func checkRandnCase(t *testing.T, c parity.Case) {
	var seed int64
	var shape []int
	c.InputValue(t, "seed", &seed)
	c.InputValue(t, "shape", &shape)
	for name := range c.Params {
		t.Fatalf("case %s: unhandled param %q", c.Name, name)
	}
	g := New(SeedFromInt(seed))
	// Each output is one randn draw from the same generator, in the order the fixture lists
	// them; today every case has one ("values").
	if len(c.Outputs) != 1 {
		t.Fatalf("case %s: %d outputs, expected exactly one (values)", c.Name, len(c.Outputs))
	}
	want := c.Output(t, "values")
	got, err := g.Randn(shape)
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	gotShape := make([]int64, len(shape))
	for i, d := range shape {
		gotShape[i] = int64(d)
	}
	if !parity.SameShape(gotShape, want.Shape) {
		t.Fatalf("case %s: shape %v, want %v", c.Name, gotShape, want.Shape)
	}
	mismatches, first := 0, -1
	for i := range want.F32 {
		if math.Float32bits(got[i]) != math.Float32bits(want.F32[i]) {
			if first < 0 {
				first = i
			}
			mismatches++
		}
	}
	t.Logf("case %s: elements=%d mismatches=%d tol=%g (bit-exact)", c.Name, len(got), mismatches, c.Tolerance.RelL2)
	if mismatches > 0 {
		t.Errorf("case %s: %d of %d values differ in their bits; first at %d: got %v (%#08x), want %v (%#08x)",
			c.Name, mismatches, len(got), first, got[first], math.Float32bits(got[first]),
			want.F32[first], math.Float32bits(want.F32[first]))
	}
}
