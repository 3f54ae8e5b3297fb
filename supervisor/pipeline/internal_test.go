package pipeline

import (
	"bytes"
	"errors"
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func mkfile(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResolveModels(t *testing.T) {
	tiny := func(root string) {
		mkfile(t, filepath.Join(root, "hunyuanvideo", "vae", "config.json"))
		mkfile(t, filepath.Join(root, "flux_redux_bfl", "image_encoder", "config.json"))
		mkfile(t, filepath.Join(root, "framepack_i2v", "config.json"))
	}
	repos := func(root string) {
		mkfile(t, filepath.Join(root, "hunyuanvideo-community", "HunyuanVideo", "vae", "config.json"))
		mkfile(t, filepath.Join(root, "lllyasviel", "flux_redux_bfl", "image_encoder", "config.json"))
		mkfile(t, filepath.Join(root, "lllyasviel", "FramePackI2V_HY", "config.json"))
	}
	hub := func(root string) {
		// FramePack's hf_download/hub: refs/main names the snapshot; an older one lies beside.
		for _, r := range []struct{ repo, probe string }{
			{"models--hunyuanvideo-community--HunyuanVideo", "vae/config.json"},
			{"models--lllyasviel--flux_redux_bfl", "image_encoder/config.json"},
			{"models--lllyasviel--FramePackI2V_HY", "config.json"},
		} {
			e := filepath.Join(root, "hub", r.repo)
			mkfile(t, filepath.Join(e, "snapshots", "abc123", r.probe))
			mkfile(t, filepath.Join(e, "snapshots", "old999", r.probe))
			mkfile(t, filepath.Join(e, "refs", "main"))
			if err := os.WriteFile(filepath.Join(e, "refs", "main"), []byte("abc123\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name    string
		make    func(string)
		want    Models // relative to root
		wantErr bool
	}{
		{name: "tiny", make: tiny, want: Models{"hunyuanvideo", "flux_redux_bfl", "framepack_i2v", ""}},
		{name: "tiny with f1", make: func(root string) { tiny(root); mkfile(t, filepath.Join(root, "framepack_f1", "config.json")) },
			want: Models{"hunyuanvideo", "flux_redux_bfl", "framepack_i2v", "framepack_f1"}},
		{name: "repositories", make: repos, want: Models{"hunyuanvideo-community/HunyuanVideo", "lllyasviel/flux_redux_bfl", "lllyasviel/FramePackI2V_HY", ""}},
		{name: "hub cache", make: hub, want: Models{"hub/models--hunyuanvideo-community--HunyuanVideo/snapshots/abc123",
			"hub/models--lllyasviel--flux_redux_bfl/snapshots/abc123", "hub/models--lllyasviel--FramePackI2V_HY/snapshots/abc123", ""}},
		{name: "empty", make: func(string) {}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			tc.make(root)
			got, err := ResolveModels(root)
			if tc.wantErr {
				if !errors.Is(err, ErrModelsNotFound) {
					t.Fatalf("err %v, want ErrModelsNotFound", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := Models{filepath.Join(root, tc.want.HunyuanVideo), filepath.Join(root, tc.want.FluxRedux), filepath.Join(root, tc.want.Transformer), ""}
			if tc.want.TransformerF1 != "" {
				want.TransformerF1 = filepath.Join(root, tc.want.TransformerF1)
			}
			if got != want {
				t.Fatalf("got %+v\nwant %+v", got, want)
			}
			if got.VAE() != filepath.Join(want.HunyuanVideo, "vae") {
				t.Fatalf("vae %s", got.VAE())
			}
		})
	}
}

func TestETA(t *testing.T) {
	e := etaModel{steps: 4, sections: 3}
	if got, _ := e.estimate(0, 1); got != 0 {
		t.Fatalf("eta before any step %v", got)
	}
	for range 4 {
		e.stepDone(time.Second)
	}
	// Section 0 done sampling: 8 steps left at 1 s, rest of a section unknown yet.
	if got, _ := e.estimate(0, 4); got != 8*time.Second {
		t.Fatalf("eta %v", got)
	}
	e.sectionDone(6 * time.Second) // 4 s of steps, 2 s of the rest
	e.stepDone(time.Second)
	// Section 1 after step 1: 3 + 4 steps, and the rest of sections 1 and 2.
	if got, _ := e.estimate(1, 1); got != 7*time.Second+4*time.Second {
		t.Fatalf("eta %v", got)
	}
	// The last step of the last section leaves only its rest.
	if got, _ := e.estimate(2, 4); got != 2*time.Second {
		t.Fatalf("eta %v", got)
	}
}

func TestTensorHelpers(t *testing.T) {
	// [1, 2, 3, 1, 2]: channel c, frame f, pixel p = 100c + 10f + p.
	v := zeros(1, 2, 3, 1, 2)
	for c := range 2 {
		for f := range 3 {
			for p := range 2 {
				v.Data[(c*3+f)*2+p] = float32(100*c + 10*f + p)
			}
		}
	}
	s := sliceT(v, 1, 3)
	if want := []float32{10, 11, 20, 21, 110, 111, 120, 121}; !equal(s.Data, want) || s.T != 2 {
		t.Fatalf("slice %v", s.Data)
	}
	c, err := concatT(sliceT(v, 2, 3), sliceT(v, 0, 1))
	if err != nil {
		t.Fatal(err)
	}
	if want := []float32{20, 21, 0, 1, 120, 121, 100, 101}; !equal(c.Data, want) {
		t.Fatalf("concat %v", c.Data)
	}
	if _, err := concatT(v, zeros(1, 3, 1, 1, 2)); err == nil {
		t.Fatal("concat of mismatched channels accepted")
	}
	if d := divided(scaled(v, 0.476986), 0.476986); d.Data[5] != v.Data[5] {
		t.Fatalf("scale round trip %v != %v", d.Data[5], v.Data[5])
	}
}

func equal(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPreviewLayout(t *testing.T) {
	// Latents that map to one constant colour per frame: frame f has channel 10 at f (its
	// factors are the largest positive ones), laid side by side.
	lat := zeros(1, 16, 3, 2, 4)
	for f := range 3 {
		for p := range 8 {
			lat.Data[(10*3+f)*8+p] = float32(f) * 2
		}
	}
	b, err := previewOf(lat)
	if err != nil {
		t.Fatal(err)
	}
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if r := img.Bounds(); r.Dx() != 12 || r.Dy() != 2 {
		t.Fatalf("preview %v, want 12x2 (3 frames of 4x2 side by side)", r)
	}
	// Frame 0: the bias only, (0.0259, −0.0192, −0.0761) clamped and ×255 → (6, 0, 0).
	r0, g0, b0, _ := img.At(1, 1).RGBA()
	if r0>>8 != 6 || g0>>8 != 0 || b0>>8 != 0 {
		t.Fatalf("frame 0 pixel %d %d %d", r0>>8, g0>>8, b0>>8)
	}
	r2, g2, _, _ := img.At(9, 0).RGBA()
	// 4·0.1166 + 0.0259 = 0.4923 → 125; 4·0.1627 − 0.0192 = 0.6316 → 161.
	if r2>>8 != 125 || g2>>8 != 161 {
		t.Fatalf("frame 2 pixel %d %d", r2>>8, g2>>8)
	}
	if _, err := previewOf(zeros(1, 4, 1, 2, 2)); err == nil {
		t.Fatal("preview of 4-channel latents accepted")
	}
}
