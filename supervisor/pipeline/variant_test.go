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
	hist, gen, err := v.InitialHistory(start, nil)
	if err != nil {
		t.Fatal(err)
	}
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

// TestI2VEndFrame checks FramePack-Studio's end frame in the i2v history: the scaled end
// latent is history frame 0, so the first section's clean latents are [start, end]; after the
// first section it sits behind the generated window, in the 2x context; f1 refuses it.
func TestI2VEndFrame(t *testing.T) {
	v := i2v{}
	start, end := fill(1, 100), fill(1, 7)
	hist, gen, err := v.InitialHistory(start, &end)
	if err != nil {
		t.Fatal(err)
	}
	if hist.T != 19 || gen != 0 || hist.Data[0] != 7 || slices.ContainsFunc(hist.Data[1:], func(x float32) bool { return x != 0 }) {
		t.Fatalf("initial history %v (generated %d), want the end latent then 18 zero frames", hist.Data, gen)
	}
	s0 := Section{Index: 0, Total: 2, Window: 2}
	sc, err := v.Context(s0, start, hist)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sc.Clean.Data, []float32{100, 7}) {
		t.Fatalf("section 0 clean latents %v, want [start, end] (clean_latents_post is the end frame)", sc.Clean.Data)
	}
	hist, _, err = v.Append(s0, start, hist, fill(2, 1))
	if err != nil {
		t.Fatal(err)
	}
	sc, err = v.Context(Section{Index: 1, Total: 2, Window: 2}, start, hist)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sc.Clean.Data, []float32{100, 1}) || !slices.Equal(sc.Clean2x.Data, []float32{2, 7}) {
		t.Fatalf("section 1 clean %v, 2x %v; want [start, newest] and [second newest, end]", sc.Clean.Data, sc.Clean2x.Data)
	}
	if _, _, err := v.InitialHistory(start, &vol{B: 1, C: 1, T: 2, H: 1, W: 1, Data: []float32{1, 2}}); err == nil {
		t.Fatal("an end latent of 2 frames was taken")
	}
	if _, _, err := (f1{}).InitialHistory(start, &end); err == nil || !strings.Contains(err.Error(), "no end frame") {
		t.Fatalf("f1 with an end frame: %v, want a clear error", err)
	}
}
