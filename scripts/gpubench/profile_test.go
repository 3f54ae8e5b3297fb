package main

import (
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/framepackd/framepackd/internal/runtime"
)

// TestProfileRun: -profile's stand-in for timed aggregates one run's ops by name and by name,
// dtype and shape, with shares that sum to one, and writes profile-<stage>.json.
func TestProfileRun(t *testing.T) {
	rt, err := runtime.New(runtime.Options{Backend: "cpu"})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	x, err := rt.FromFloat32(make([]float32, 8*16), 8, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer x.Free()
	w, err := rt.FromFloat32(make([]float32, 4*16), 4, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Free()
	qkv, err := w.Reshape(1, 1, 4, 16)
	if err != nil {
		t.Fatal(err)
	}
	defer qkv.Free()
	runs := 0
	fn := func() error {
		runs++
		for range 3 {
			o, err := rt.Attention(qkv, qkv, qkv, nil, runtime.AttentionParams{})
			if err != nil {
				return err
			}
			o.Free()
			y, err := rt.Linear(x, w, nil)
			if err != nil {
				return err
			}
			z, err := rt.SiLU(y)
			y.Free()
			if err != nil {
				return err
			}
			z.Free()
		}
		return nil
	}
	p := &profile{Stage: "toy"}
	if err := p.run(rt, &result{}, 1, 2, fn); err != nil {
		t.Fatal(err)
	}
	if runs != 2 {
		t.Errorf("fn ran %d times, want 2 (one warm, one profiled)", runs)
	}
	calls := map[string]int{}
	var share float64
	for _, r := range p.Ops {
		calls[r.Op] = r.Calls
		share += r.Share
	}
	if calls["linear"] != 3 || calls["silu"] != 3 || calls["attention"] != 3 || len(p.Ops) != 3 {
		t.Errorf("ops %+v: want attention, linear and silu, 3 calls each", p.Ops)
	}
	var served uint64
	for _, n := range p.AttentionServed {
		served += n
	}
	if served != 3 {
		t.Errorf("attention served %v: want 3 in all (the warm run's not counted)", p.AttentionServed)
	}
	if share < 0.999 || share > 1.001 {
		t.Errorf("shares sum to %v", share)
	}
	if len(p.ByShape) != 3 {
		t.Errorf("by shape %+v: want three rows", p.ByShape)
	}
	for _, r := range p.ByShape {
		if want := map[string]string{"attention": "1x1x4x16", "linear": "8x4", "silu": "8x4"}[r.Op]; r.Shape != want || r.DType != "f32" {
			t.Errorf("by shape row %+v: want f32 %s", r, want)
		}
	}
	dir := t.TempDir()
	if err := p.write(dir, io.Discard); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "profile-toy.json"))
	if err != nil {
		t.Fatal(err)
	}
	var back profile
	if err := json.Unmarshal(raw, &back); err != nil || back.Stage != "toy" || len(back.Ops) != 3 {
		t.Errorf("profile-toy.json: %v %+v", err, back)
	}
}
