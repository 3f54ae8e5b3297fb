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
	runs := 0
	fn := func() error {
		runs++
		for range 3 {
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
	if calls["linear"] != 3 || calls["silu"] != 3 || len(p.Ops) != 2 {
		t.Errorf("ops %+v: want linear and silu, 3 calls each", p.Ops)
	}
	if share < 0.999 || share > 1.001 {
		t.Errorf("shares sum to %v", share)
	}
	if len(p.ByShape) != 2 || p.ByShape[0].Shape != "8x4" || p.ByShape[0].DType != "f32" {
		t.Errorf("by shape %+v: want two rows of f32 8x4", p.ByShape)
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
	if err := json.Unmarshal(raw, &back); err != nil || back.Stage != "toy" || len(back.Ops) != 2 {
		t.Errorf("profile-toy.json: %v %+v", err, back)
	}
}
