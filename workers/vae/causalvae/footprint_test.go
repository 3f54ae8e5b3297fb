package causalvae

import (
	"errors"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
)

// TestFootprintEstimate runs tiles of several shapes on the cpu runtime and compares the
// allocator's peak above the weights with the estimate: never below it, and at most 25 %
// above, so a tiling chosen from the estimate neither runs out of memory nor wastes it.
func TestFootprintEstimate(t *testing.T) {
	m := peakModel(t)
	c := m.Config
	o := m.Footprint()
	whole := DefaultTiling()
	whole.TileSampleMinNumFrames, whole.TileSampleStrideNumFrames = 1<<20, 1<<20
	for _, tc := range []struct {
		name   string
		in     [5]int
		encode bool
	}{
		{"decode 1×4×6", [5]int{1, c.LatentChannels, 1, 4, 6}, false},
		{"decode 3×8×12", [5]int{1, c.LatentChannels, 3, 8, 12}, false},
		{"decode 5×6×10", [5]int{1, c.LatentChannels, 5, 6, 10}, false},
		{"decode 2×16×16", [5]int{1, c.LatentChannels, 2, 16, 16}, false},
		{"encode 1×64×96", [5]int{1, c.InChannels, 1, 64, 96}, true},
		{"encode 9×32×48", [5]int{1, c.InChannels, 9, 32, 48}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rt := m.Runtime()
			if err := rt.ResetPeak(); err != nil {
				t.Fatal(err)
			}
			base := rt.Memory().Allocated
			x := randomVolume(tc.in, 7)
			var err error
			if tc.encode {
				_, err = m.EncodeMoments(t.Context(), x, RunOptions{Tiling: whole})
			} else {
				_, err = m.Decode(t.Context(), x, RunOptions{Tiling: whole})
			}
			if err != nil {
				t.Fatal(err)
			}
			got := int64(rt.Memory().Peak - base)
			est, err := m.Estimate(tc.in, whole, tc.encode, o)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("peak %d bytes, estimate %d (%.2f×)", got, est.PeakBytes, float64(est.PeakBytes)/float64(got))
			if est.PeakBytes < got || float64(est.PeakBytes) > 1.25*float64(got) {
				t.Errorf("estimate %d bytes for a measured peak of %d", est.PeakBytes, got)
			}
		})
	}
}

// capModel loads the vae fixture's model into a runtime with a memory cap of the weights plus
// budget bytes.
func capModel(t *testing.T, fx *parity.Fixture, budget int64) *Model {
	t.Helper()
	rt := newRuntime(t)
	m := loadFixtureModel(t, fx, rt)
	if err := rt.SetMemoryCap(int64(rt.Memory().Allocated) + budget); err != nil {
		t.Fatal(err)
	}
	return m
}

// TestChooseTilingUnderCap runs the fixture's tiled decode cases with the tiling chosen from a
// cap: a cap the untiled decode does not fit decodes by tiling, within the case's tolerance,
// with the allocator's peak under the cap (the untiled run's estimate over it); a cap too small for the smallest tile fails with
// ErrMemoryBudget before any work.
func TestChooseTilingUnderCap(t *testing.T) {
	fx := parity.Load(t, "vae")
	probe := peakModel(t)
	o := probe.Footprint()
	ran := 0
	for _, c := range fx.Cases {
		if c.Op != "vae.decode" && c.Op != "vae.encode" {
			continue
		}
		want := tilingFromParams(t, c)
		if !want.Spatial {
			continue
		}
		ran++
		t.Run(c.Name, func(t *testing.T) {
			encode := c.Op == "vae.encode"
			key := "z"
			if encode {
				key = "x"
			}
			in := volumeOf(t, c.Input(t, key))
			exact, err := probe.Estimate(in.Shape, want, encode, o)
			if err != nil {
				t.Fatal(err)
			}
			cands, err := probe.Candidates(in.Shape, encode, o)
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range cands {
				t.Logf("candidate %s: peak estimate %d bytes, work %d", ch, ch.PeakBytes, ch.Work)
			}
			if cands[0].TilePx != 0 || cands[0].PeakBytes <= exact.PeakBytes {
				t.Fatalf("the untiled run (%s) does not need more than the case's tiling (%s)", cands[0], exact)
			}
			// A budget just above the case's tiling's estimate: the untiled run and every larger
			// tile do not fit, the case's tiles do.
			budget := exact.PeakBytes + exact.PeakBytes/20
			ch, err := probe.ChooseTiling(in.Shape, encode, budget, o)
			if err != nil {
				t.Fatal(err)
			}
			if ch.Tiling != want {
				t.Fatalf("chose %+v, the case is %+v", ch.Tiling, want)
			}
			m := capModel(t, fx, budget)
			rt := m.Runtime()
			if err := rt.ResetPeak(); err != nil {
				t.Fatal(err)
			}
			opts := RunOptions{Tiling: ch.Tiling}
			if encode {
				mean, _, err := m.Encode(t.Context(), in, opts)
				if err != nil {
					t.Fatal(err)
				}
				c.Check(t, "mean", mean.Data, mean.ShapeInt64(), c.Output(t, "mean"))
			} else {
				out, err := m.Decode(t.Context(), in, opts)
				if err != nil {
					t.Fatal(err)
				}
				c.Check(t, "sample", out.Data, out.ShapeInt64(), c.Output(t, "sample"))
			}
			mem := rt.Memory()
			t.Logf("chose %s; peak %d bytes under a cap of %d", ch, mem.Peak, mem.Cap)
			if mem.Peak > mem.Cap {
				t.Fatalf("peak %d over the cap %d", mem.Peak, mem.Cap)
			}

			if cands[0].PeakBytes <= budget {
				t.Fatalf("the untiled run's estimate %d fits the budget %d", cands[0].PeakBytes, budget)
			}

			// Too small for the smallest tile: a budget error before any work.
			_, err = probe.ChooseTiling(in.Shape, encode, cands[len(cands)-1].PeakBytes-1, o)
			if !errors.Is(err, ErrMemoryBudget) {
				t.Fatalf("budget below the smallest tile: %v", err)
			}
			t.Logf("smallest: %v", err)
		})
	}
	if ran == 0 {
		t.Fatal("no spatially tiled vae case")
	}
}

// TestChooseTilingLargeBudget: with room to spare the choice is diffusers' framewise default
// without spatial tiles (the least work).
func TestChooseTilingLargeBudget(t *testing.T) {
	m := peakModel(t)
	o := m.Footprint()
	for _, T := range []int{2, 6} {
		in := [5]int{1, m.Config.LatentChannels, T, 8, 12}
		ch, err := m.ChooseTiling(in, false, 1<<40, o)
		if err != nil {
			t.Fatal(err)
		}
		if ch.Tiling != DefaultTiling() || ch.TilePx != 0 {
			t.Errorf("%d frames: chose %s", T, ch)
		}
	}
}

// TestChooseTilingFullSize plans FramePack's decode (18 latent frames at 68×88, the released
// VAE's config, no weights needed) on the GPUs' scratch models: with room to spare diffusers'
// framewise chunks alone, under an 8 GiB cap (less 0.5 GiB of weights) the tiling with the
// least work whose estimate fits with the conv scratch (strips of the whole height or width,
// less work than any square tiling that fits; NCDHW 16-bit: tiles of at most 384 px, as 512 px
// tiles left cuDNN's search too little room on an H100), under 32 MiB a budget error; and the
// candidates' estimates shrink down the list.
func TestChooseTilingFullSize(t *testing.T) {
	m := &Model{Config: DefaultConfig()}
	in := [5]int{1, 16, 18, 68, 88}
	for _, tc := range []struct {
		name string
		o    FootprintOptions
	}{{"hip f32", FootprintOptions{"hip", runtime.F32, runtime.F16}}, {"hip 16-bit", FootprintOptions{"hip", runtime.F16, runtime.F16}},
		{"cuda 16-bit", FootprintOptions{"cuda", runtime.F16, runtime.F16}}} {
		o := tc.o
		cands, err := m.Candidates(in, false, o)
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range cands {
			t.Logf("%s: %s: %.2f GiB, work %.3g", tc.name, c, float64(c.PeakBytes)/(1<<30), float64(c.Work))
			if i > 0 && (c.PeakBytes >= cands[i-1].PeakBytes || c.TilePx == 0) {
				t.Errorf("candidate %d (%s) does not need less than the one before", i, c)
			}
		}
		if cands[0].TilePx != 0 || len(cands) < 4 {
			t.Fatalf("candidates %v", cands)
		}
		ch, err := m.ChooseTiling(in, false, 1<<40, o)
		if err != nil || ch.TilePx != 0 {
			t.Errorf("room to spare: %s, %v", ch, err)
		}
		budget := int64(8<<30 - 512<<20)
		ch, err = m.ChooseTiling(in, false, budget, o)
		if err != nil || ch.TilePx == 0 || ch.PeakBytes > budget {
			t.Errorf("8 GiB cap: %s (%d bytes), %v", ch, ch.PeakBytes, err)
		}
		t.Logf("%s under an 8 GiB cap: %s", tc.name, ch)
		// the least work that fits is a tiling in strips of the whole height or width
		// (544×704: the strips overlap along one side only), and less work than every square
		// tiling that fits
		if tl := ch.Tiling; tl.TileSampleMinHeight != 544 && tl.TileSampleMinWidth != 704 {
			t.Errorf("%s, 8 GiB cap: %s is not in strips", tc.name, ch)
		}
		for _, c := range cands {
			if tl := c.Tiling; c.TilePx > 0 && tl.TileSampleMinHeight == tl.TileSampleMinWidth && c.PeakBytes <= budget && c.Work <= ch.Work {
				t.Errorf("%s, 8 GiB cap: square tiles %s fit with no more work than %s", tc.name, c, ch)
			}
		}
		if tc.name == "hip 16-bit" && ch.TilePx > 384 {
			t.Errorf("8 GiB cap, 16-bit: %d px tiles leave the conv search no room", ch.TilePx)
		}
		if _, err := m.ChooseTiling(in, false, 32<<20, o); !errors.Is(err, ErrMemoryBudget) {
			t.Errorf("32 MiB: %v", err)
		}
	}
}
