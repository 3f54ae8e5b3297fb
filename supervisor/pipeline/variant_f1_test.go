package pipeline

import (
	"slices"
	"testing"

	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// TestF1Variant walks a three-section job (window 2) through the f1 variant and checks each
// answer against demo_gradio_f1.py's bookkeeping.
func TestF1Variant(t *testing.T) {
	v, err := variantByName(VariantF1)
	if err != nil || v.Name() != VariantF1 {
		t.Fatalf("variantByName(f1) = %v, %v", v, err)
	}
	start := fill(1, 100)
	hist, gen, err := v.InitialHistory(start, nil)
	if err != nil {
		t.Fatal(err)
	}
	// zeros(16+2+1) then the start latent, which counts as generated.
	if hist.T != 20 || gen != 1 || hist.Data[19] != 100 || slices.ContainsFunc(hist.Data[:19], func(x float32) bool { return x != 0 }) {
		t.Fatalf("initial history T=%d generated=%d data=%v", hist.T, gen, hist.Data)
	}
	const w = 2
	for i, base := range []float32{10, 20, 30} {
		s := Section{Index: i, Total: 3, Window: w}
		ctx, err := v.Context(s, start, hist)
		if err != nil {
			t.Fatal(err)
		}
		// arange(0, 1+16+2+1+w) split [1, 16, 2, 1, w]; clean indices [start, 1x].
		if !slices.Equal(ctx.Indices.Latent, []int64{20, 21}) || !slices.Equal(ctx.Indices.Clean, []int64{0, 19}) ||
			!slices.Equal(ctx.Indices.Clean2x, []int64{17, 18}) || len(ctx.Indices.Clean4x) != 16 || ctx.Indices.Clean4x[0] != 1 {
			t.Fatalf("section %d indices %+v", i, ctx.Indices)
		}
		// 4x/2x/1x from the end of the history; clean = start + the newest frame.
		newest := hist.Data[hist.T-1]
		if ctx.Clean.T != 2 || ctx.Clean.Data[0] != 100 || ctx.Clean.Data[1] != newest || ctx.Clean2x.T != 2 ||
			ctx.Clean2x.Data[1] != hist.Data[hist.T-2] || ctx.Clean4x.T != plan.Clean4x || ctx.Clean4x.Data[15] != hist.Data[hist.T-4] {
			t.Fatalf("section %d context: clean %v 2x %v 4x %v, history %v", i, ctx.Clean.Data, ctx.Clean2x.Data, ctx.Clean4x.Data, hist.Data)
		}
		var added int
		if hist, added, err = v.Append(s, start, hist, fill(w, base)); err != nil || added != w || hist.Data[hist.T-1] != base+1 {
			t.Fatalf("append %d: added %d, newest %v, err %v", i, added, hist.Data[hist.T-1], err)
		}
		gen += added
		d := v.DecodeRange(s, hist, gen, i == 0)
		switch i {
		case 0: // every real frame: the start latent and the first window
			if d.T != 3 || d.Data[0] != 100 || d.Data[2] != 11 {
				t.Fatalf("first decode %v", d.Data)
			}
		default: // the newest 2w frames
			if d.T != 2*w || d.Data[d.T-1] != base+1 || d.Data[0] != hist.Data[hist.T-2*w] {
				t.Fatalf("section %d decode %v", i, d.Data)
			}
		}
	}
	if gen != 7 || hist.T != 19+7 {
		t.Fatalf("generated %d, history %d frames; want 7 and 26", gen, hist.T)
	}
	// The blend appends the new pixels after the history.
	old, cur := fill(9, 0), fill(9, 50)
	out, err := v.Blend(Section{Index: 1, Total: 3, Window: 3}, cur, old)
	if err != nil || out.T != 9 || out.Data[0] != 0 || out.Data[8] != 58 {
		t.Fatalf("blend T=%d data %v err %v: history first, then the overlap, then the new frames", out.T, out.Data, err)
	}
}
