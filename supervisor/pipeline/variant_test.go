package pipeline

import (
	"slices"
	"strings"
	"testing"
)

// fill returns a [1, 1, t, 1, 1] latent whose frame k holds base+k.
func fill(t int, base float32) vol {
	v := zeros(1, 1, t, 1, 1)
	for k := range v.Data {
		v.Data[k] = base + float32(k)
	}
	return v
}

func TestVariantByName(t *testing.T) {
	for _, name := range []string{"", VariantI2V} {
		v, err := variantByName(name)
		if err != nil || v.Name() != VariantI2V {
			t.Fatalf("variantByName(%q) = %v, %v; want i2v (an old checkpoint without a variant is i2v)", name, v, err)
		}
	}
	if _, err := variantByName("nope"); err == nil || !strings.Contains(err.Error(), "i2v") {
		t.Fatalf("unknown variant: %v, want an error listing the known ones", err)
	}
}

// TestI2VVariant walks a two-section job (window 2) through the i2v variant and checks each
// answer against demo_gradio.py's bookkeeping.
func TestI2VVariant(t *testing.T) {
	v := i2v{}
	start := fill(1, 100)
	hist, gen := v.InitialHistory(start)
	if hist.T != 19 || gen != 0 || slices.ContainsFunc(hist.Data, func(x float32) bool { return x != 0 }) {
		t.Fatalf("initial history T=%d generated=%d, want 19 zero frames, 0 generated", hist.T, gen)
	}
	s0 := Section{Index: 0, Total: 2, Window: 2}
	ctx, err := v.Context(s0, start, hist)
	if err != nil {
		t.Fatal(err)
	}
	// padding 1: arange(0, 1+2+2+1+2+16) split [1, 2, 2, 1, 2, 16]
	if !slices.Equal(ctx.Indices.Latent, []int64{3, 4}) || !slices.Equal(ctx.Indices.Clean, []int64{0, 5}) ||
		ctx.Clean.T != 2 || ctx.Clean.Data[0] != 100 || ctx.Clean2x.T != 2 || ctx.Clean4x.T != 16 {
		t.Fatalf("section 0 context %+v", ctx.Indices)
	}
	hist, added, err := v.Append(s0, start, hist, fill(2, 10))
	if err != nil || added != 2 || hist.T != 21 || hist.Data[0] != 10 || hist.Data[2] != 0 {
		t.Fatalf("append 0: T=%d added=%d first=%v err=%v", hist.T, added, hist.Data[0], err)
	}
	if d := v.DecodeRange(s0, hist, 2, true); d.T != 2 || d.Data[0] != 10 {
		t.Fatalf("first decode %d frames from %v", d.T, d.Data)
	}
	s1 := Section{Index: 1, Total: 2, Window: 2}
	if ctx, err = v.Context(s1, start, hist); err != nil || ctx.Clean.Data[1] != 10 || !slices.Equal(ctx.Indices.Latent, []int64{1, 2}) {
		t.Fatalf("section 1 context %+v err %v: 1x must be the newest history frame", ctx.Indices, err)
	}
	// The last section prepends the start latent.
	hist, added, err = v.Append(s1, start, hist, fill(2, 20))
	if err != nil || added != 3 || hist.Data[0] != 100 || hist.Data[1] != 20 || hist.Data[3] != 10 {
		t.Fatalf("append 1: added=%d data=%v err=%v", added, hist.Data[:5], err)
	}
	if d := v.DecodeRange(s1, hist, 5, false); d.T != 5 || d.Data[0] != 100 {
		t.Fatalf("last decode %d frames, want 2w+1 = 5 from the front", d.T)
	}
}
