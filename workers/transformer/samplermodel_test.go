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
