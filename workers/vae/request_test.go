package main

import (
	"reflect"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/internal/workerkit/tensorio"
	"github.com/framepackd/framepackd/workers/vae/causalvae"
)

// TestLogvarRef checks where the log-variance goes: the request's ref when it names a file or a
// tensor, else "<latents>.logvar" in latents' file, keeping a dtype or shape logvar states.
func TestLogvarRef(t *testing.T) {
	latents := workerkit.TensorRef{Path: "/dev/shm/j/lat", Name: "latents", DType: safetensors.BF16, Shape: []int64{1, 16, 1, 4, 4}}
	tests := []struct {
		name   string
		logvar workerkit.TensorRef
		want   workerkit.TensorRef
	}{
		{"unset: fallback", workerkit.TensorRef{},
			workerkit.TensorRef{Path: latents.Path, Name: "latents" + LogvarSuffix, DType: safetensors.BF16, Shape: latents.Shape}},
		{"dtype only: fallback in that dtype", workerkit.TensorRef{DType: safetensors.F32},
			workerkit.TensorRef{Path: latents.Path, Name: "latents" + LogvarSuffix, DType: safetensors.F32, Shape: latents.Shape}},
		{"own file", workerkit.TensorRef{Path: "/dev/shm/j/lv", Name: "lv"}, workerkit.TensorRef{Path: "/dev/shm/j/lv", Name: "lv"}},
		{"same file, own name", workerkit.TensorRef{Path: latents.Path, Name: "lv"}, workerkit.TensorRef{Path: latents.Path, Name: "lv"}},
		{"name without a path is kept (and refused by the output check)", workerkit.TensorRef{Name: "lv"}, workerkit.TensorRef{Name: "lv"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := logvarRef(&workerkit.VAEEncodeRequest{Latents: latents, Logvar: tt.logvar})
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	if err := tensorio.CheckFloatOutput("logvar", workerkit.TensorRef{Name: "lv"}); err == nil {
		t.Fatal("a logvar ref without a path was accepted")
	}
}

// TestTilingFromDefaults checks the documented meaning of a stated VaeTiling: zero sizes keep
// diffusers' defaults (framewise on, spatial off), a frame count sets the framewise chunk; and
// the reported tiling (wireTiling) reads back as the one run.
func TestTilingFromDefaults(t *testing.T) {
	def := causalvae.DefaultTiling()
	if !def.FramewiseEncoding || !def.FramewiseDecoding || def.Spatial {
		t.Fatalf("defaults %+v: want framewise on, spatial off", def)
	}
	if got := tilingFrom(nil); got != def {
		t.Errorf("unset: %+v, want %+v", got, def)
	}
	off := tilingFrom(&workerkit.VAETiling{TileSampleMinNumFrames: 32})
	if !off.FramewiseDecoding || off.TileSampleMinNumFrames != 32 || off.TileSampleStrideNumFrames != def.TileSampleStrideNumFrames {
		t.Errorf("a 32-frame chunk: %+v", off)
	}
	sp := tilingFrom(&workerkit.VAETiling{EnableSpatialTiling: true})
	want := def
	want.Spatial = true
	if sp != want {
		t.Errorf("spatial with zero sizes: %+v, want %+v", sp, want)
	}
	small := want
	small.TileSampleMinHeight, small.TileSampleStrideHeight = 64, 48
	wire := wireTiling(small)
	if back := tilingFrom(&wire); back != small || wire.TileSampleMinHeight != 64 || wire.TileSampleMinNumFrames != 16 {
		t.Errorf("reported %+v reads back as %+v, want %+v", wire, back, small)
	}
}
