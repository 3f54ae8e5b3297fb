package dit

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
)

// forwardOut runs forward case c on m and returns the velocity.
func forwardOut(t *testing.T, m *Model, c parity.Case) []float32 {
	t.Helper()
	fc := decodeForward(t, c)
	sec, err := m.Prepare(fc.cond, [5]int(fc.x.Shape))
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	defer sec.Close()
	out, err := m.Forward(context.Background(), sec, fc.x.Data, fc.timestep, fc.guidance, ForwardOptions{})
	if err != nil {
		t.Fatalf("case %s: %v", c.Name, err)
	}
	return out
}

// fixtureFootprint is the fixture's transformer directory and the footprint of its config.
func fixtureFootprint(t *testing.T, fx *parity.Fixture) (string, Footprint) {
	t.Helper()
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	fp, err := EstimateFootprint(cfg, nil, LoadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return dir, fp
}

// forwardCases is the fixture's transformer.forward cases; the test fails without one.
func forwardCases(t *testing.T, fx *parity.Fixture) []parity.Case {
	t.Helper()
	var cases []parity.Case
	for _, c := range fx.Cases {
		if c.Op == OpForward {
			cases = append(cases, c)
		}
	}
	if len(cases) == 0 {
		t.Fatal("no transformer.forward case")
	}
	return cases
}

// forwardOuts runs every case on m: a reference model's outputs, computed once for every
// compareForwards against it.
func forwardOuts(t *testing.T, m *Model, cases []parity.Case) [][]float32 {
	t.Helper()
	outs := make([][]float32, len(cases))
	for i, c := range cases {
		outs[i] = forwardOut(t, m, c)
	}
	return outs
}

// compareForwards runs every case on m and compares its output bit for bit with the reference
// model's (want, from forwardOuts); with checkSample also with the fixture's sample, within
// the case's tolerance (widened for 16-bit activations).
func compareForwards(t *testing.T, what string, m *Model, cases []parity.Case, want [][]float32, checkSample bool) {
	t.Helper()
	for i, c := range cases {
		out := forwardOut(t, m, c)
		sameBits(t, what+" "+c.Name, out, want[i])
		if checkSample {
			c = c.ForActivations(m.act != 0 && m.act != runtime.F32) // 0: f32
			fc := decodeForward(t, c)
			c.Check(t, what+" sample", out, toInt64s(fc.x.Shape), c.Output(t, "sample"))
		}
	}
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: value %d is %v, all-resident %v (not bit-identical)", what, i, got[i], want[i])
		}
	}
}

func loadWith(t *testing.T, rt *runtime.Runtime, fx *parity.Fixture, opts LoadOptions) *Model {
	t.Helper()
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(rt, dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestStreamingBitIdentical runs every transformer.forward case with blocks streamed (one,
// three and no blocks resident; f32, f16 and as-stored bf16 weights) and compares each output bit for bit
// with the all-resident model's, and with the reference.
func TestStreamingBitIdentical(t *testing.T) {
	fx := parity.Load(t, "transformer")
	cases := forwardCases(t, fx)
	for _, wdt := range []runtime.DType{runtime.F32, runtime.F16, runtime.AsStored} {
		rt := newTestRuntime(t)
		all := loadWith(t, rt, fx, LoadOptions{WeightDType: wdt})
		if all.StreamedBlocks() != 0 {
			t.Fatalf("default load streams %d blocks", all.StreamedBlocks())
		}
		total := all.ResidentBlocks()
		want := forwardOuts(t, all, cases)
		for _, resident := range []int{1, 3, NoResidentBlocks} {
			m := loadWith(t, rt, fx, LoadOptions{WeightDType: wdt, MaxResidentBlocks: resident})
			wantResident := max(resident, 0)
			if m.ResidentBlocks() != wantResident || m.StreamedBlocks() != total-wantResident {
				t.Fatalf("max %d resident: %d resident, %d streamed (of %d)", resident, m.ResidentBlocks(), m.StreamedBlocks(), total)
			}
			if m.WeightBytes() != all.WeightBytes() || m.NumParams() != all.NumParams() {
				t.Errorf("max %d resident: %d bytes, %d params; all-resident %d, %d", resident, m.WeightBytes(), m.NumParams(), all.WeightBytes(), all.NumParams())
			}
			compareForwards(t, wdt.String(), m, cases, want, wdt == runtime.F32)
			n := len(cases)
			if m.CopiedBytes() < int64(n)*m.StreamedBytes() {
				t.Errorf("max %d resident: %d bytes copied over %d forwards of %d streamed bytes", resident, m.CopiedBytes(), n, m.StreamedBytes())
			}
		}
	}
}

// TestStreamingUnderCap gives the runtime a cap below the all-resident model's peak: Load
// plans fewer resident blocks, the forward finishes, its output is the all-resident one bit
// for bit, and the runtime's peak stayed under the cap.
func TestStreamingUnderCap(t *testing.T) {
	fx := parity.Load(t, "transformer")
	var c parity.Case
	for _, cc := range fx.Cases {
		if cc.Op == OpForward {
			c = cc
			break
		}
	}
	rtAll := newTestRuntime(t)
	all := loadWith(t, rtAll, fx, LoadOptions{})
	weights := int64(rtAll.Memory().Allocated)
	want := forwardOut(t, all, c)
	peakAll := int64(rtAll.Memory().Peak)
	act := peakAll - weights

	_, fp := fixtureFootprint(t, fx)
	if fp.Need(fp.Blocks()) != weights {
		t.Errorf("footprint of all blocks resident %d bytes; the runtime holds %d after load", fp.Need(fp.Blocks()), weights)
	}
	stream := fp.Need(0) + act
	if stream >= peakAll {
		t.Fatalf("streaming every block needs %d bytes, all-resident peaks at %d: the fixture cannot show streaming", stream, peakAll)
	}
	memCap := stream + (peakAll-stream)/2

	rt := newTestRuntime(t)
	if err := rt.SetMemoryCap(memCap); err != nil {
		t.Fatal(err)
	}
	m := loadWith(t, rt, fx, LoadOptions{MemoryCap: memCap, ActivationBytes: act})
	if m.StreamedBlocks() == 0 {
		t.Fatalf("cap %d (all-resident peak %d): nothing streamed", memCap, peakAll)
	}
	sameBits(t, "under cap", forwardOut(t, m, c), want)
	st := rt.Memory()
	t.Logf("cap %d: %d of %d blocks resident, peak %d (all-resident %d)", memCap, m.ResidentBlocks(), fp.Blocks(), st.Peak, peakAll)
	if int64(st.Peak) > memCap {
		t.Errorf("peak %d over the cap %d", st.Peak, memCap)
	}
}

// TestStreamingCapTooSmall: a cap that cannot hold even one streamed block fails Load with
// ErrMemoryBudget before anything is uploaded.
func TestStreamingCapTooSmall(t *testing.T) {
	fx := parity.Load(t, "transformer")
	dir, fp := fixtureFootprint(t, fx)
	rt := newTestRuntime(t)
	memCap := fp.Need(0) - 1
	_, err := Load(rt, dir, LoadOptions{MemoryCap: memCap})
	if !errors.Is(err, ErrMemoryBudget) {
		t.Fatalf("cap %d (streaming needs %d): got %v, want ErrMemoryBudget", memCap, fp.Need(0), err)
	}
	t.Log(err)
	if st := rt.Memory(); st.Peak != 0 || st.LiveTensors != 0 {
		t.Errorf("after the refused load: peak %d bytes, %d live tensors; want nothing loaded", st.Peak, st.LiveTensors)
	}
}

func TestFootprintPlan(t *testing.T) {
	fp := Footprint{Base: 100, Double: 30, Single: 10, NumDouble: 2, NumSingle: 3}
	for _, tc := range []struct {
		name             string
		memCap, act      int64
		max, want        int
		wantBudgetErrors bool
	}{
		{name: "no cap", want: 5},
		{name: "no cap, max 2", max: 2, want: 2},
		{name: "everything fits", memCap: 190, want: 5},
		{name: "activations push two out", memCap: 190, act: 5, want: 2}, // 3 or 4 resident need the all-resident 190 with their slots
		{name: "one double block resident", memCap: 160, want: 1},        // its slot is the single blocks' pair
		{name: "max under what fits", memCap: 1000, max: 1, want: 1},
		{name: "too small", memCap: 159, wantBudgetErrors: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fp.Plan(tc.memCap, tc.act, tc.max)
			if tc.wantBudgetErrors {
				if !errors.Is(err, ErrMemoryBudget) {
					t.Fatalf("got %d, %v; want ErrMemoryBudget", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
}

// TestActivationBytesByDType: the activation estimate counts the [L, dim] tensors in the
// activation dtype (bf16 half of f32's) and the rope tables in f32 in both.
func TestActivationBytesByDType(t *testing.T) {
	cfg := Config{NumAttentionHeads: 24, AttentionHeadDim: 128, PatchSize: 2}
	w := Workload{Height: 544, Width: 704, LatentWindowSize: 9}
	f32 := cfg.ActivationBytes(w)
	w.ActivationDType = runtime.BF16
	bf16 := cfg.ActivationBytes(w)
	rope := int64(cfg.Tokens(w)) * 4 * 4 * 128 // cos and sin, joint and image rows
	if f32 <= 0 || bf16-rope != (f32-rope)/2 {
		t.Fatalf("estimate f32 %d, bf16 %d (rope tables %d): want the non-rope part halved", f32, bf16, rope)
	}
}
