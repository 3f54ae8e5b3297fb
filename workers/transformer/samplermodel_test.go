package main

import (
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/workers/transformer/dit"
	"github.com/framepackd/framepackd/workers/transformer/sampler"
	"github.com/framepackd/framepackd/workers/transformer/sampler/samplertest"
)

// loadFixtureDiT loads the fixture's "transformer" model in process, on a cpu runtime that
// poisons freed memory.
func loadFixtureDiT(t *testing.T, fx *parity.Fixture) *dit.Model {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("close runtime: %v", err)
		}
	})
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	m, err := dit.Load(rt, dir, dit.LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestParitySampler runs the sampler fixture's sample_hunyuan cases through the packed DiT
// (samplertest.RunParityCase checks every step's x and denoised) and checks that TeaCache skipped
// exactly the transformer calls the reference skipped.
func TestParitySampler(t *testing.T) {
	fx := parity.Load(t, "sampler")
	m := loadFixtureDiT(t, fx)
	ran := 0
	for _, c := range fx.Cases {
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case samplertest.OpSampleHunyuan:
				sm := newSamplerModel(m)
				defer sm.Close()
				calls := 0
				sm.onForward = func(sampler.ForwardInput) { calls++ }
				samplertest.RunParityCase(t, c, sm)
				checkTeaCacheCalls(t, c, sm, calls)
				ran++
			case "sampler.sigmas":
				t.Skipf("case %s: schedule only, checked by the sampler package", c.Name)
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
		})
	}
	if ran == 0 {
		t.Fatal("no sample_hunyuan cases")
	}
}

// checkTeaCacheCalls compares the model's TeaCache record with the reference's accumulated
// distance per transformer call (0 where the blocks ran).
func checkTeaCacheCalls(t *testing.T, c parity.Case, sm *samplerModel, calls int) {
	d := samplertest.Decode(t, c)
	ref := d.TeaCacheRelL1
	if len(ref) == 0 {
		return
	}
	if calls != len(ref) {
		t.Errorf("case %s: %d transformer calls, reference %d", c.Name, calls, len(ref))
		return
	}
	if !d.Request.TeaCache {
		for i, v := range ref {
			if v != 0 {
				t.Errorf("case %s: TeaCache off but reference call %d skipped (accumulated %v)", c.Name, i, v)
			}
		}
		t.Logf("case %s: TeaCache off, %d transformer calls all computed", c.Name, calls)
		return
	}
	if d.Request.Guidance.CFG != 1 {
		t.Fatalf("case %s: TeaCache with real CFG: the reference shares one state between branches", c.Name)
	}
	got := sm.teaCache(sampler.Positive).Calls
	if len(got) != len(ref) {
		t.Fatalf("case %s: TeaCache saw %d calls, reference %d", c.Name, len(got), len(ref))
	}
	for i, r := range ref {
		refSkipped := r != 0
		t.Logf("case %s teacache call %d: computed=%v accumulated=%.6g, reference computed=%v accumulated=%.6g",
			c.Name, i, got[i].Computed, got[i].Accumulated, !refSkipped, r)
		if got[i].Computed == refSkipped {
			t.Errorf("case %s: call %d computed=%v, reference computed=%v", c.Name, i, got[i].Computed, !refSkipped)
		}
		if refSkipped && abs(got[i].Accumulated-r) > 1e-3*abs(r) {
			t.Errorf("case %s: call %d accumulated %v, reference %v", c.Name, i, got[i].Accumulated, r)
		}
	}
	if s := sm.teaCache(sampler.Positive).Skipped(); s == 0 {
		t.Errorf("case %s: TeaCache skipped nothing", c.Name)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// TestMagCacheSkipsBlocks samples the sampler fixture's TeaCache case with MagCache instead:
// the positive branch's forwards skip exactly the steps dit.MagCacheSkips names for the
// section's shape and steps, a skipped step changes the result (the cached residual stands in
// for the blocks), and a threshold that skips nothing gives the uncached result bit for bit.
// The values of a skipped run against FramePack-Studio's are TestParityPipelineMagCache's
// (supervisor/pipeline).
func TestMagCacheSkipsBlocks(t *testing.T) {
	fx := parity.Load(t, "sampler")
	m := loadFixtureDiT(t, fx)
	var d samplertest.Case
	found := false
	for _, c := range fx.Cases {
		if c.Op != samplertest.OpSampleHunyuan {
			continue
		}
		if d = samplertest.Decode(t, c); d.Request.Guidance.CFG == 1 && d.Request.Steps >= 3 {
			found = true
			break
		}
	}
	if !found {
		t.Fatal("the sampler fixture has no sample_hunyuan case at cfg 1 with 3 steps or more")
	}
	run := func(settings *dit.MagCacheSettings) ([]float32, *samplerModel) {
		t.Helper()
		sm := newSamplerModel(m)
		t.Cleanup(sm.Close)
		req := d.Request
		req.TeaCache = false
		if settings != nil {
			sm.magSettings = *settings
			req.MagCache = true
		}
		out, err := sampler.Sample(t.Context(), sm, req)
		if err != nil {
			t.Fatal(err)
		}
		return out, sm
	}
	plain, _ := run(nil)
	settings := dit.MagCacheSettings{Calibration: dit.MagCacheFramePack, Threshold: 0.25, MaxConsecutiveSkips: 3, RetentionRatio: 0}
	cached, sm := run(&settings)
	shape := d.Request.Shape
	ratios, err := dit.MagRatios(settings.Calibration, shape.H()*8, shape.W()*8, d.Request.Steps)
	if err != nil {
		t.Fatal(err)
	}
	want := dit.MagCacheSkips(ratios, settings.Threshold, settings.MaxConsecutiveSkips, settings.RetentionRatio)
	calls := sm.cacheCalls()
	if len(calls) != len(want) {
		t.Fatalf("%d forwards, want %d", len(calls), len(want))
	}
	skipped := 0
	for i, c := range calls {
		if c.Computed == want[i] {
			t.Errorf("step %d computed=%v, the pattern skips=%v", i, c.Computed, want[i])
		}
		if !c.Computed {
			skipped++
		}
	}
	t.Logf("magcache pattern %v, %d of %d steps skipped", want, skipped, len(want))
	if skipped == 0 {
		t.Fatal("the case skips no step: pick settings that skip one")
	}
	if rel := parity.RelL2(cached, plain); rel == 0 || rel > 0.5 {
		t.Errorf("skipping %d steps moved the result by rel_l2 %v; want a change, and a small one", skipped, rel)
	}
	none := dit.MagCacheSettings{Calibration: dit.MagCacheFramePack, Threshold: 1e-9, MaxConsecutiveSkips: 1, RetentionRatio: 0}
	same, sm2 := run(&none)
	if sm2.cacheSkipped() != 0 {
		t.Fatalf("threshold 1e-9 skipped %d forwards", sm2.cacheSkipped())
	}
	for i := range same {
		if same[i] != plain[i] {
			t.Fatalf("MagCache that skips nothing differs from no cache at %d: %v vs %v", i, same[i], plain[i])
		}
	}
}
