package dit

import (
	"path/filepath"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// TestFootprintFP8 sizes the fixture's transformer from its bf16 checkpoint quantized at load and
// from each fp8 checkpoint, and checks the 8-bit blocks count their 8-bit bytes (plus the
// scales): quantized, a block takes at most 0.6× its bf16 bytes and the residency plan keeps every
// block under a cap that holds few bf16 ones; from a file, a block's estimate is its tensors'
// stored bytes, and the loaded model's bytes equal the estimate.
func TestFootprintFP8(t *testing.T) {
	fx := parity.Load(t, "fp8")
	dir, err := fx.ModelPath("transformer")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(dir)
	if err != nil {
		t.Fatal(err)
	}
	base, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer base.Close()
	as := LoadOptions{WeightDType: runtime.AsStored, ActivationDType: runtime.BF16}
	bf16, err := EstimateFootprint(cfg, base, as)
	if err != nil {
		t.Fatal(err)
	}
	q := as
	q.QuantizeLinear = true
	quant, err := EstimateFootprint(cfg, base, q)
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, fp Footprint) {
		t.Logf("%s: double %d, single %d, base %d bytes (bf16: %d, %d, %d)", name, fp.Double, fp.Single, fp.Base, bf16.Double, bf16.Single, bf16.Base)
		if fp.Double <= 0 || float64(fp.Double) > 0.6*float64(bf16.Double) || float64(fp.Single) > 0.6*float64(bf16.Single) {
			t.Errorf("%s: blocks of %d and %d bytes, bf16 %d and %d: want at most 0.6×", name, fp.Double, fp.Single, bf16.Double, bf16.Single)
		}
		limit := fp.Need(fp.Blocks()) // every 8-bit block resident
		if r, _ := bf16.Plan(limit, 0, 0); r >= bf16.Blocks() {
			t.Errorf("%s: a cap of %d holds every bf16 block too: the test shows nothing", name, limit)
		}
		if r, err := fp.Plan(limit, 0, 0); err != nil || r != fp.Blocks() {
			t.Errorf("%s: plan under %d: %d of %d blocks resident (%v)", name, limit, r, fp.Blocks(), err)
		}
	}
	check("quantized at load", quant)
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	for _, f := range []string{"fp8_plain_e4m3fn", "fp8_comfy_scaled", "fp8_musubi_channel"} {
		ck, err := safetensors.OpenCheckpoint(filepath.Join(fx.Root, "models", "fp8", f+".safetensors"))
		if err != nil {
			t.Fatal(err)
		}
		fp, err := EstimateFootprint(cfg, ck, as)
		if err != nil {
			t.Fatal(err)
		}
		var stored int64 // block 0's tensors as the file stores them
		for _, n := range ck.Names() {
			if info, _ := ck.Info(n); len(n) > 19 && n[:19] == "transformer_blocks." && n[19] == '0' && n[20] == '.' {
				stored += info.End - info.Begin
			}
		}
		if fp.Double != stored {
			t.Errorf("%s: double block estimated at %d bytes, the file stores %d", f, fp.Double, stored)
		}
		m, err := New(rt, cfg, ck, as)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := m.WeightBytes(), fp.Need(fp.Blocks()); got != want {
			t.Errorf("%s: loaded %d weight bytes, the footprint says %d", f, got, want)
		}
		m.Close()
		ck.Close()
	}
}
