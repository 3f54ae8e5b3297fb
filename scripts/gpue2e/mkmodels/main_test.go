package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
)

const fixtures = "../../../testdata/parity/models"

// writeManifest writes dir/<key>/{manifest.json,config.json} as torch_bench.py --manifests-only
// does (torch dtype names, f32 for every float tensor), from the fixture checkpoint of m plus
// extra tensors.
func writeManifest(t *testing.T, dir string, m model, extra map[string][]int64) {
	t.Helper()
	ck, err := safetensors.OpenCheckpoint(filepath.Join(fixtures, m.fixture))
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	type entry struct {
		Shape []int64 `json:"shape"`
		DType string  `json:"dtype"`
	}
	ts := map[string]entry{}
	for _, name := range ck.Names() {
		ti, _ := ck.Info(name)
		ts[name] = entry{Shape: ti.Shape, DType: "float32"}
	}
	for name, shape := range extra {
		ts[name] = entry{Shape: shape, DType: "float32"}
	}
	ts["some.position_ids"] = entry{Shape: []int64{1, 5}, DType: "int64"}
	ts["some.mask"] = entry{Shape: []int64{5}, DType: "bool"}
	d := filepath.Join(dir, m.key)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]any{"model": m.key, "tensors": ts})
	if err := os.WriteFile(filepath.Join(d, "manifest.json"), raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, "config.json"), []byte(`{"full": true}`), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestManifestModels checks the full-size path on a manifest made from the fixtures with one
// more layer than they have: every manifest tensor is written with its shape, float tensors
// take the fixture's dtype (the extra layer's from layer 0), int64 buffers count along their
// last dimension, bool buffers are left out, the config is the manifest's, a sharded model has
// an index naming every tensor's file, and a second run keeps what is there.
func TestManifestModels(t *testing.T) {
	man, out := t.TempDir(), t.TempDir()
	llama := models[0]
	writeManifest(t, man, llama, map[string][]int64{"layers.9.mlp.up_proj.weight": {64, 32}})
	ts, cfg, err := specOf(llama, fixtures, man)
	if err != nil {
		t.Fatal(err)
	}
	if string(cfg) != `{"full": true}` {
		t.Errorf("config %s", cfg)
	}
	byName := map[string]tensor{}
	for _, x := range ts {
		byName[x.Name] = x
	}
	if x := byName["layers.9.mlp.up_proj.weight"]; x.DType != safetensors.F16 || !slices.Equal(x.Shape, []int64{64, 32}) {
		t.Errorf("extra layer %+v, want F16 [64 32] (layer 0's dtype)", x)
	}
	if x := byName["some.position_ids"]; x.DType != safetensors.I64 {
		t.Errorf("position ids %+v", x)
	}
	if _, ok := byName["some.mask"]; ok {
		t.Error("bool buffer written")
	}
	n, kept, err := writeModel(filepath.Join(out, llama.out), llama.base, ts, cfg, 1<<20, stampOf(ts, cfg, 1<<20, 1), 1, 3)
	if err != nil || kept {
		t.Fatalf("write: %v (kept %v)", err, kept)
	}
	dir := filepath.Join(out, llama.out)
	ck, err := safetensors.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	if got := len(ck.Names()); got != len(ts) {
		t.Errorf("%d tensors read back, %d written", got, len(ts))
	}
	var total int64
	shards := map[string]bool{}
	for _, x := range ts {
		ti, ok := ck.Info(x.Name)
		if !ok || ti.DType != x.DType || !slices.Equal(ti.Shape, x.Shape) {
			t.Fatalf("%s read back as %+v, wrote %+v", x.Name, ti, x)
		}
		f, _ := ck.File(x.Name)
		shards[f.Path()] = true
		total += x.bytes()
	}
	if total != n || len(shards) < 2 {
		t.Errorf("%d bytes in %d shards, want %d in several", total, len(shards), n)
	}
	ids, _, err := ck.Float32("some.position_ids")
	if err != nil || !slices.Equal(ids, []float32{0, 1, 2, 3, 4}) {
		t.Errorf("position ids %v (%v)", ids, err)
	}
	w, _, err := ck.Float32("layers.9.mlp.up_proj.weight")
	if err != nil {
		t.Fatal(err)
	}
	neg := 0
	for _, v := range w {
		if a := max(v, -v); a < 1.0/1024 || a >= 1.0/16 {
			t.Fatalf("value %v outside 2^-10 … 2^-5", v)
		}
		if v < 0 {
			neg++
		}
	}
	if neg < len(w)/3 || neg > 2*len(w)/3 {
		t.Errorf("%d of %d values negative", neg, len(w))
	}
	if _, kept, err := writeModel(dir, llama.base, ts, cfg, 1<<20, stampOf(ts, cfg, 1<<20, 1), 1, 3); err != nil || !kept {
		t.Errorf("second write: kept %v, %v", kept, err)
	}
}

// TestManifestMissingFixtureTensor: a manifest that lacks a tensor of the fixture (another
// reference version) is refused, naming it; CLIP's names are written under text_model., the
// hub's layout, whether the manifest has the wrapper or not.
func TestManifestMissingFixtureTensor(t *testing.T) {
	man := t.TempDir()
	clip := models[1]
	writeManifest(t, man, clip, nil)
	ts, _, err := specOf(clip, fixtures, man)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range ts {
		if !strings.HasPrefix(x.Name, "text_model.") {
			t.Fatalf("CLIP tensor %s not under text_model.", x.Name)
		}
	}
	raw, _ := os.ReadFile(filepath.Join(man, clip.key, "manifest.json"))
	var m map[string]map[string]any
	_ = json.Unmarshal(raw, &m)
	delete(m["tensors"], "final_layer_norm.weight")
	raw, _ = json.Marshal(m)
	_ = os.WriteFile(filepath.Join(man, clip.key, "manifest.json"), raw, 0o644)
	if _, _, err := specOf(clip, fixtures, man); err == nil {
		t.Fatal("no error")
	} else if want := "final_layer_norm.weight"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not name %s", err, want)
	}
}

// BenchmarkWrite draws and writes a 1 GB bf16 checkpoint in two shards (GB/s per op).
func BenchmarkWrite(b *testing.B) {
	ts := []tensor{{Name: "a", DType: safetensors.BF16, Shape: []int64{1 << 14, 1 << 14}}, {Name: "b", DType: safetensors.BF16, Shape: []int64{1 << 14, 1 << 14}}}
	dir := b.TempDir()
	b.SetBytes(ts[0].bytes() * 2)
	for i := range b.N {
		if _, _, err := writeModel(dir, "m", ts, []byte("{}"), 600<<20, stampOf(ts, nil, 0, uint64(i)), uint64(i), runtime.NumCPU()); err != nil {
			b.Fatal(err)
		}
	}
}

// TestResizePreprocessor: with manifests, the copied SigLIP preprocessor takes the full-size
// config's image_size and keeps its other settings.
func TestResizePreprocessor(t *testing.T) {
	dir, cfg := t.TempDir(), t.TempDir()
	if err := copyDir(filepath.Join(fixtures, "flux_redux_bfl/feature_extractor"), dir); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfg, "config.json"), []byte(`{"image_size": 384, "patch_size": 14}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := resizePreprocessor(dir, cfg); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "preprocessor_config.json"))
	var pre struct {
		Size     map[string]int `json:"size"`
		Resample int            `json:"resample"`
	}
	if err := json.Unmarshal(raw, &pre); err != nil {
		t.Fatal(err)
	}
	if pre.Size["height"] != 384 || pre.Size["width"] != 384 || pre.Resample != 3 {
		t.Errorf("preprocessor %s", raw)
	}
}
