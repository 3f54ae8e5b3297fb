package llama

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/framepackd/framepackd/internal/nn"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
)

// opCounter counts runtime ops by name through the runtime's op observer.
type opCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *opCounter) observe(e runtime.OpEvent) {
	if e.Phase != runtime.OpBegin {
		return
	}
	c.mu.Lock()
	c.n[e.Op]++
	c.mu.Unlock()
}

func (c *opCounter) get(op string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[op]
}

func (c *opCounter) reset() {
	c.mu.Lock()
	c.n = map[string]int{}
	c.mu.Unlock()
}

func newRuntime(t *testing.T, obs runtime.OpObserver) *runtime.Runtime {
	t.Helper()
	rt, err := runtime.New(runtime.Options{Threads: 2, Poison: true, OpObserver: obs})
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

func loadModel(t *testing.T, rt *runtime.Runtime, dir string, index int) *Model {
	return loadModelAs(t, rt, dir, index, 0)
}

// loadModelAs loads with activations in act (0: f32).
func loadModelAs(t *testing.T, rt *runtime.Runtime, dir string, index int, act runtime.DType) *Model {
	t.Helper()
	m, err := Load(rt, dir, Options{HiddenStateIndex: index, Options: nn.Options{DType: act}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func idsMask(a, b parity.Array) ([]int32, []bool) {
	ids := make([]int32, len(a.Ints))
	for i, v := range a.Ints {
		ids[i] = int32(v)
	}
	mask := make([]bool, len(b.Ints))
	for i, v := range b.Ints {
		mask[i] = v != 0
	}
	return ids, mask
}

func download(t *testing.T, x *runtime.Tensor) ([]float32, []int64) {
	t.Helper()
	v, err := x.Float32()
	if err != nil {
		t.Fatal(err)
	}
	shape := make([]int64, x.Rank())
	for i, d := range x.Shape() {
		shape[i] = int64(d)
	}
	return v, shape
}

// TestParityTextencLlamaModel runs the Llama model in process on the fixture's reference ids and
// checks hidden_states[hidden_state_index][:, crop_start:n_attended] against llama_vec, and
// every intermediate hidden state it has (each with its own load plan).
func TestParityTextencLlamaModel(t *testing.T) { parityLlama(t, runtime.F32) }

// TestParityTextencLlamaModelHalf is TestParityTextencLlamaModel with fp16 activations
// (FramePack's text encoder dtype, or the 16-bit one $FRAMEPACK_ACTIVATION_DTYPE names):
// within parity.HalfRelL2.
func TestParityTextencLlamaModelHalf(t *testing.T) {
	act, err := runtime.ParseActivationDType(parity.HalfActivations("fp16"))
	if err != nil {
		t.Fatal(err)
	}
	parityLlama(t, act)
}

func parityLlama(t *testing.T, act runtime.DType) {
	fx := parity.Load(t, "textenc")
	dir, err := fx.ModelPath("text_encoder")
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntime(t, nil)
	models := map[int]*Model{}
	model := func(index int) *Model {
		if models[index] == nil {
			models[index] = loadModelAs(t, rt, dir, index, act)
		}
		return models[index]
	}
	checked := 0
	for _, c := range fx.Cases {
		if c.Op != "textenc.encode_prompt_conds" {
			continue
		}
		c = c.ForActivations(act != runtime.F32)
		var index, cropStart int
		if !c.Param(t, "hidden_state_index", &index) || !c.Param(t, "crop_start", &cropStart) {
			t.Fatalf("case %s: params hidden_state_index and crop_start are required", c.Name)
		}
		ids, mask := idsMask(c.Input(t, "llama_ids"), c.Input(t, "llama_mask"))
		nAttended := 0
		for _, k := range mask {
			if k {
				nAttended++
			}
		}
		h, err := model(index).HiddenState(ids, mask)
		if err != nil {
			t.Fatalf("case %s: %v", c.Name, err)
		}
		vec, err := rt.Slice(h, 1, cropStart, nAttended)
		h.Free()
		if err != nil {
			t.Fatalf("case %s: crop: %v", c.Name, err)
		}
		got, shape := download(t, vec)
		vec.Free()
		c.Check(t, "llama_vec", got, shape, c.Output(t, "llama_vec"))
		var nStates int
		c.Param(t, "num_hidden_states", &nStates)
		for k := range nStates {
			name := fmt.Sprintf("llama_hidden_%d", k)
			if _, ok := c.Intermediates[name]; !ok {
				continue
			}
			want := c.Intermediate(t, name)
			h, err := model(k).HiddenState(ids, mask)
			if err != nil {
				t.Fatalf("case %s %s: %v", c.Name, name, err)
			}
			rows := int(want.Shape[1]) // the reference keeps the attended prefix
			hc, err := rt.Slice(h, 1, 0, rows)
			h.Free()
			if err != nil {
				t.Fatalf("case %s %s: %v", c.Name, name, err)
			}
			got, shape := download(t, hc)
			hc.Free()
			c.Check(t, name, got, shape, want)
		}
		checked++
	}
	if checked == 0 {
		t.Fatal("the textenc fixture has no textenc.encode_prompt_conds case")
	}
}

// TestLayersComputed checks that hidden_states[-3] loads and computes exactly
// num_hidden_layers − 2 decoder layers, counted by the runtime's op observer, and leaves the
// other layers' and the final norm's weights in the checkpoint.
func TestLayersComputed(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir, err := fx.ModelPath("text_encoder")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	c := &opCounter{n: map[string]int{}}
	rt := newRuntime(t, c.observe)
	tests := []struct {
		name      string
		index     int
		layers    int
		finalNorm bool
	}{
		{"framepack -3", -3, cfg.NumHiddenLayers - 2, false},
		{"embeddings", 0, 0, false},
		{"first layer", 1, 1, false},
		{"last", -1, cfg.NumHiddenLayers, true},
	}
	ids := []int32{128000, 1, 2, 3, 4, 5}
	mask := []bool{true, true, true, true, true, false}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := loadModel(t, rt, dir, tc.index)
			if m.Plan.Layers != tc.layers || m.Plan.FinalNorm != tc.finalNorm || len(m.Layers) != tc.layers {
				t.Fatalf("plan %+v with %d layers bound, want %d layers, final norm %v", m.Plan, len(m.Layers), tc.layers, tc.finalNorm)
			}
			skippedLayers := map[string]bool{}
			normSkipped := false
			for _, n := range m.Report.Skipped {
				if n == "norm.weight" {
					normSkipped = true
				}
				if rest, ok := strings.CutPrefix(n, "layers."); ok {
					skippedLayers[strings.SplitN(rest, ".", 2)[0]] = true
				}
			}
			if len(skippedLayers) != cfg.NumHiddenLayers-tc.layers || normSkipped == tc.finalNorm {
				t.Errorf("skipped %d layers (norm %v), want %d (norm %v): %v", len(skippedLayers), normSkipped,
					cfg.NumHiddenLayers-tc.layers, !tc.finalNorm, m.Report.Skipped)
			}
			if len(m.Report.Unexpected) != 0 {
				t.Errorf("unexpected tensors: %v", m.Report.Unexpected)
			}
			c.reset()
			h, err := m.HiddenState(ids, mask)
			if err != nil {
				t.Fatal(err)
			}
			h.Free()
			if got := c.get("attention"); got != tc.layers {
				t.Errorf("%d attention ops, want %d", got, tc.layers)
			}
			norms := 2 * tc.layers
			if tc.finalNorm {
				norms++
			}
			if got := c.get("rms norm"); got != norms {
				t.Errorf("%d rms norm ops, want %d", got, norms)
			}
			t.Logf("%s: %d layers, %d attention ops, %d rms norms, %d weight bytes", tc.name, m.Plan.Layers,
				c.get("attention"), c.get("rms norm"), m.WeightBytes())
		})
	}
}

// TestBadInput checks the errors callers map to InvalidArgument.
func TestBadInput(t *testing.T) {
	fx := parity.Load(t, "textenc")
	dir, err := fx.ModelPath("text_encoder")
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntime(t, nil)
	m := loadModel(t, rt, dir, -3)
	tests := []struct {
		name string
		ids  []int32
		mask []bool
	}{
		{"id past vocabulary", []int32{1, int32(m.Config.VocabSize)}, []bool{true, true}},
		{"negative id", []int32{-1}, []bool{true}},
		{"empty mask", []int32{1, 2}, []bool{false, false}},
		{"length mismatch", []int32{1, 2}, []bool{true}},
		{"empty", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h, err := m.HiddenState(tc.ids, tc.mask)
			if err == nil {
				h.Free()
				t.Fatal("no error")
			}
			if !errors.Is(err, nn.ErrBadInput) {
				t.Fatalf("error %v does not wrap ErrBadInput", err)
			}
		})
	}
	if _, err := NewPlan(m.Config, m.Config.NumHiddenLayers+1); err == nil {
		t.Error("NewPlan accepted an index past the last hidden state")
	}
}

func TestConfigValidate(t *testing.T) {
	theta := 1e4
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{"ok", Config{VocabSize: 8, HiddenSize: 8, IntermediateSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 2}, ""},
		{"gqa mismatch", Config{VocabSize: 8, HiddenSize: 8, IntermediateSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 4, NumKeyValueHeads: 3}, "multiple of num_key_value_heads"},
		{"indivisible", Config{VocabSize: 8, HiddenSize: 10, IntermediateSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 4}, "divisible"},
		{"rope llama3", Config{VocabSize: 8, HiddenSize: 8, IntermediateSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 2,
			RopeParameters: &RopeParameters{RopeType: "llama3", RopeTheta: &theta}}, `rope type "llama3"`},
		{"act", Config{VocabSize: 8, HiddenSize: 8, IntermediateSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 2, HiddenAct: "relu2"}, `"relu2"`},
		{"not llama", Config{ModelType: "mistral", VocabSize: 8, HiddenSize: 8, IntermediateSize: 8, NumHiddenLayers: 2, NumAttentionHeads: 2}, "mistral"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if tc.cfg.NumKeyValueHeads != 2 || tc.cfg.HeadDim != 4 || tc.cfg.HiddenAct != "silu" {
					t.Errorf("defaults not filled: %+v", tc.cfg)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
