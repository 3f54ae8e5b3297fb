package clip

import (
	"errors"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
)

func newRuntime(t *testing.T) *runtime.Runtime {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Threads: 2, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if m := rt.Memory(); m.LiveTensors != 0 {
			t.Errorf("leak: %d tensors (%d bytes) still held", m.LiveTensors, m.Allocated)
		}
		if err := rt.Close(); err != nil {
			t.Error(err)
		}
	})
	return rt
}

func loadFixtureModel(t *testing.T, rt *runtime.Runtime) (*parity.Fixture, *Model) {
	return loadFixtureModelAs(t, rt, 0)
}

// loadFixtureModelAs loads with activations in act (0: f32).
func loadFixtureModelAs(t *testing.T, rt *runtime.Runtime, act runtime.DType) (*parity.Fixture, *Model) {
	t.Helper()
	fx := parity.Load(t, "textenc")
	dir, err := fx.ModelPath("text_encoder_2")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(rt, dir, Options{DType: act})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	if len(m.Report.Unexpected) != 0 {
		t.Errorf("unexpected tensors: %v", m.Report.Unexpected)
	}
	return fx, m
}

func ids32(a parity.Array) []int32 {
	ids := make([]int32, len(a.Ints))
	for i, v := range a.Ints {
		ids[i] = int32(v)
	}
	return ids
}

// TestParityTextencCLIPModel runs CLIPTextModel in process on the fixture's reference ids and
// checks pooler_output.
func TestParityTextencCLIPModel(t *testing.T) { parityCLIP(t, runtime.F32) }

// TestParityTextencCLIPModelHalf is TestParityTextencCLIPModel with fp16 activations
// (FramePack's text encoder dtype, or the 16-bit one $FRAMEPACK_ACTIVATION_DTYPE names):
// within parity.HalfRelL2.
func TestParityTextencCLIPModelHalf(t *testing.T) {
	act, err := runtime.ParseActivationDType(parity.HalfActivations("fp16"))
	if err != nil {
		t.Fatal(err)
	}
	parityCLIP(t, act)
}

func parityCLIP(t *testing.T, act runtime.DType) {
	rt := newRuntime(t)
	fx, m := loadFixtureModelAs(t, rt, act)
	checked := 0
	for _, c := range fx.Cases {
		if c.Op != "textenc.encode_prompt_conds" {
			continue
		}
		c = c.ForActivations(act != runtime.F32)
		p, err := m.Pooled(ids32(c.Input(t, "clip_ids")))
		if err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
		got, err := p.Float32()
		if err != nil {
			t.Fatal(err)
		}
		shape := []int64{int64(p.Dim(0)), int64(p.Dim(1))}
		p.Free()
		c.Check(t, "clip_pooler", got, shape, c.Output(t, "clip_pooler"))
		checked++
	}
	if checked == 0 {
		t.Fatal("the textenc fixture has no textenc.encode_prompt_conds case")
	}
}

func TestPoolIndex(t *testing.T) {
	legacy, eos := LegacyEOSTokenID, 7
	tests := []struct {
		name string
		eos  int
		ids  []int32
		want int
	}{
		{"legacy argmax", legacy, []int32{5, 9, 3, 9, 9}, 1},
		{"legacy first", legacy, []int32{9, 1}, 0},
		{"eos first match", eos, []int32{5, 9, 7, 7, 1}, 2},
		{"eos absent", eos, []int32{5, 9, 3}, 0},
		{"eos id 2 is never matched by value", legacy, []int32{2, 4, 2}, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{EOSTokenID: &tc.eos}
			if got := c.PoolIndex(tc.ids); got != tc.want {
				t.Errorf("PoolIndex = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestPoolingRuleByConfig checks that the model pools where its config's rule says: the same ids
// give different outputs under the legacy rule and an explicit eos_token_id, and each equals the
// output for the ids cut right after the position its rule picks.
func TestPoolingRuleByConfig(t *testing.T) {
	rt := newRuntime(t)
	_, m := loadFixtureModel(t, rt)
	ids := []int32{10, 40, 300, 20, 5, 5}
	pooled := func(ids []int32) []float32 {
		p, err := m.Pooled(ids)
		if err != nil {
			t.Fatal(err)
		}
		defer p.Free()
		v, err := p.Float32()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	legacy := pooled(ids) // argmax: position 2
	saved := *m.Config.EOSTokenID
	eos := 20
	m.Config.EOSTokenID = &eos // first 20: position 3
	defer func() { m.Config.EOSTokenID = &saved }()
	explicit := pooled(ids)
	m.Config.EOSTokenID = &saved
	if e := parity.RelL2(legacy, pooled(ids[:3])); e != 0 {
		t.Errorf("legacy pool differs from the prefix up to the argmax: rel_l2 %g", e)
	}
	m.Config.EOSTokenID = &eos
	if e := parity.RelL2(explicit, pooled(ids[:4])); e != 0 {
		t.Errorf("eos pool differs from the prefix up to the eos: rel_l2 %g", e)
	}
	if parity.RelL2(explicit, legacy) == 0 {
		t.Error("both rules pooled the same row")
	}
}

func TestBadInput(t *testing.T) {
	rt := newRuntime(t)
	_, m := loadFixtureModel(t, rt)
	long := make([]int32, m.Config.MaxPositionEmbeddings+1)
	tests := []struct {
		name string
		ids  []int32
	}{
		{"empty", nil},
		{"too long", long},
		{"id past vocabulary", []int32{1, int32(m.Config.VocabSize)}},
		{"negative id", []int32{-3}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := m.Pooled(tc.ids)
			if err == nil {
				p.Free()
				t.Fatal("no error")
			}
			if !errors.Is(err, nn.ErrBadInput) {
				t.Fatalf("error %v does not wrap ErrBadInput", err)
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	base := func() Config {
		return Config{VocabSize: 8, HiddenSize: 8, IntermediateSize: 8, NumHiddenLayers: 1, NumAttentionHeads: 2, MaxPositionEmbeddings: 4}
	}
	c := base()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.HiddenAct != "quick_gelu" || *c.EOSTokenID != 49407 || c.LayerNormEps != 1e-5 {
		t.Errorf("defaults not filled: %+v", c)
	}
	c = base()
	c.HiddenAct = "relu"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `"relu"`) {
		t.Errorf("hidden_act relu: %v", err)
	}
	c = base()
	c.NumAttentionHeads = 3
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "divisible") {
		t.Errorf("3 heads: %v", err)
	}
}
