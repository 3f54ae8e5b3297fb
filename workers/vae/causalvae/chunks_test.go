package causalvae

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
)

// TestEncodeChunks checks that 12 frames in runs of 8 encode as the first 8 and the last 4
// frames encoded alone, joined in time (FramePack-Studio's video_encode in batches), and that
// runs as long as the video are one plain encode.
func TestEncodeChunks(t *testing.T) {
	if got := Chunks(20, 16); !slices.Equal(got, [][2]int{{0, 16}, {16, 20}}) {
		t.Fatalf("Chunks(20, 16) = %v", got)
	}
	if got := Chunks(8, 16); !slices.Equal(got, [][2]int{{0, 8}}) {
		t.Fatalf("Chunks(8, 16) = %v", got)
	}
	fx := parity.Load(t, "vae")
	m := loadFixtureModel(t, fx, newRuntime(t))
	r := rand.New(rand.NewPCG(1, 2))
	x := NewVolume([5]int{1, 3, 12, 16, 16})
	for i := range x.Data {
		x.Data[i] = float32(r.Float64()*2 - 1)
	}
	mean, logvar, err := m.EncodeChunks(t.Context(), x, 8, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var parts []Volume
	for _, c := range [][2]int{{0, 8}, {8, 12}} {
		size := x.Shape
		size[2] = c[1] - c[0]
		p := NewVolume(size)
		copyRegion(p, [5]int{}, x, [5]int{0, 0, c[0], 0, 0}, size)
		mv, lv, err := m.Encode(t.Context(), p, RunOptions{})
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, mv, lv)
	}
	// 8 frames give 2 latent frames, 4 frames 1.
	if mean.Shape[2] != 3 || parts[0].Shape[2] != 2 || parts[2].Shape[2] != 1 {
		t.Fatalf("shapes %v, %v, %v", mean.Shape, parts[0].Shape, parts[2].Shape)
	}
	for k, got := range []Volume{mean, logvar} {
		want := NewVolume(got.Shape)
		copyRegion(want, [5]int{}, parts[k], [5]int{}, parts[k].Shape)
		copyRegion(want, [5]int{0, 0, 2, 0, 0}, parts[2+k], [5]int{}, parts[2+k].Shape)
		if !slices.Equal(got.Data, want.Data) {
			t.Errorf("output %d differs from the runs encoded alone", k)
		}
	}
	whole, _, err := m.Encode(t.Context(), x, RunOptions{})
	if err != nil {
		t.Fatal(err)
	}
	one, _, err := m.EncodeChunks(t.Context(), x, 16, RunOptions{})
	if err != nil || !slices.Equal(one.Data, whole.Data) {
		t.Errorf("one run: %v, or differs from Encode", err)
	}
	if slices.Equal(mean.Data, whole.Data) {
		t.Error("runs of 8 frames encode as one run of 12: the test does not tell them apart")
	}
}
