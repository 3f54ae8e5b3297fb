package llama

import (
	"errors"
	"math"
	"testing"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// TestStreamingLayers computes the fixture's hidden states with layers streamed (one and no
// layers resident; f32 and as-stored weights) and compares them bit for bit with the
// all-resident model's; a cap below the all-resident peak streams and stays under it; a cap too
// small for two layer slots fails Load before anything is uploaded.
func TestStreamingLayers(t *testing.T) {
	dir, ids, mask := promptFixture(t)
	for _, wdt := range []runtime.DType{0, runtime.AsStored} {
		rt := newRuntime(t, nil)
		want, all := hiddenStates(t, rt, dir, ids, mask, Options{HiddenStateIndex: -3, Options: nn.Options{WeightDType: wdt}})
		if all.StreamedLayers() != 0 || all.ResidentLayers() < 2 {
			t.Fatalf("all-resident: %d resident, %d streamed", all.ResidentLayers(), all.StreamedLayers())
		}
		for _, max := range []int{1, NoResidentLayers} {
			got, m := hiddenStates(t, rt, dir, ids, mask, Options{HiddenStateIndex: -3, Options: nn.Options{WeightDType: wdt}, MaxResidentLayers: max})
			if m.StreamedLayers() == 0 || m.WeightBytes() != all.WeightBytes() {
				t.Fatalf("max %d: %d streamed, %d weight bytes (all-resident %d)", max, m.StreamedLayers(), m.WeightBytes(), all.WeightBytes())
			}
			sameBits(t, wdt.String()+" streamed", "all-resident", got, want)
		}
	}

	// Under a cap: every layer (hidden_states[-1]), so that two slots undercut them.
	rtAll := newRuntime(t, nil)
	want, all := hiddenStates(t, rtAll, dir, ids, mask, Options{HiddenStateIndex: -1})
	peakAll := int64(rtAll.Memory().Peak)
	act := peakAll - all.Report.Bytes
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	layer := LayerBytes(cfg, ck, "", Options{})
	weightsOutside := all.Report.Bytes - int64(all.ResidentLayers())*layer
	memCap := weightsOutside + 2*layer + act + (peakAll-weightsOutside-2*layer-act)/2
	if memCap >= peakAll || weightsOutside+2*layer+act >= peakAll {
		t.Fatalf("two layer slots (%d each) and %d of activations do not undercut the all-resident peak %d", layer, act, peakAll)
	}
	rt := newRuntime(t, nil)
	if err := rt.SetMemoryCap(memCap); err != nil {
		t.Fatal(err)
	}
	got, m := hiddenStates(t, rt, dir, ids, mask, Options{HiddenStateIndex: -1, MemoryCap: memCap, ActivationBytes: act})
	if m.StreamedLayers() == 0 {
		t.Fatalf("cap %d: nothing streamed", memCap)
	}
	sameBits(t, "under cap", "all-resident", got, want)
	if p := rt.Memory().Peak; int64(p) > memCap {
		t.Errorf("peak %d over the cap %d", p, memCap)
	}
	t.Logf("cap %d: %d of %d layers resident, peak %d (all-resident %d)", memCap, m.ResidentLayers(), len(m.Layers), rt.Memory().Peak, peakAll)

	rtSmall := newRuntime(t, nil)
	if _, err := Load(rtSmall, dir, Options{HiddenStateIndex: -3, MemoryCap: 2*layer - 1}); !errors.Is(err, ErrMemoryBudget) {
		t.Fatalf("cap below two layers: %v, want ErrMemoryBudget", err)
	}
	if st := rtSmall.Memory(); st.Peak != 0 {
		t.Errorf("the refused load peaked at %d bytes", st.Peak)
	}
}

// promptFixture returns the fixture text encoder's folder and the Llama ids and mask of its
// first encode_prompt_conds case.
func promptFixture(t *testing.T) (dir string, ids []int32, mask []bool) {
	t.Helper()
	fx := parity.Load(t, "textenc")
	dir, err := fx.ModelPath("text_encoder")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range fx.Cases {
		if c.Op == "textenc.encode_prompt_conds" {
			ids, mask = idsMask(c.Input(t, "llama_ids"), c.Input(t, "llama_mask"))
			return dir, ids, mask
		}
	}
	t.Fatal("no textenc.encode_prompt_conds case")
	return "", nil, nil
}

// hiddenStates loads the text encoder in dir into rt with o (closed when the test ends) and
// computes the hidden states of ids and mask.
func hiddenStates(t *testing.T, rt *runtime.Runtime, dir string, ids []int32, mask []bool, o Options) ([]float32, *Model) {
	t.Helper()
	m, err := Load(rt, dir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := m.Close(); err != nil {
			t.Errorf("close text encoder: %v", err)
		}
	})
	h, err := m.HiddenState(ids, mask)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	v, _ := download(t, h)
	return v, m
}

// sameBits fails the test unless got is want bit for bit; ref names the model want comes from.
func sameBits(t *testing.T, what, ref string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, %s %d", what, len(got), ref, len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d is %v, %s %v", what, i, got[i], ref, want[i])
		}
	}
}
