package causalvae

import (
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
)

// TilingFromParams applies a fixture case's params as diffusers would: spatial sizes given
// mean enable_tiling(...) with them; frame sizes change the framewise chunking.
func tilingFromParams(t testing.TB, c parity.Case) Tiling {
	t.Helper()
	tl := DefaultTiling()
	for _, p := range []struct {
		name    string
		dst     *int
		spatial bool
	}{
		{"tile_sample_min_height", &tl.TileSampleMinHeight, true},
		{"tile_sample_min_width", &tl.TileSampleMinWidth, true},
		{"tile_sample_stride_height", &tl.TileSampleStrideHeight, true},
		{"tile_sample_stride_width", &tl.TileSampleStrideWidth, true},
		{"tile_sample_min_num_frames", &tl.TileSampleMinNumFrames, false},
		{"tile_sample_stride_num_frames", &tl.TileSampleStrideNumFrames, false},
	} {
		if c.Param(t, p.name, p.dst) && p.spatial {
			tl.Spatial = true
		}
	}
	var on bool
	if c.Param(t, "use_tiling", &on) {
		tl.Spatial = on
	}
	if c.Param(t, "use_framewise_decoding", &on) {
		tl.FramewiseDecoding = on
	}
	if c.Param(t, "use_framewise_encoding", &on) {
		tl.FramewiseEncoding = on
	}
	return tl
}

func volumeOf(t testing.TB, a parity.Array) Volume {
	t.Helper()
	if len(a.Shape) != 5 {
		t.Fatalf("%s: shape %v is not 5-d", a.Key, a.Shape)
	}
	var s [5]int
	for i, d := range a.Shape {
		s[i] = int(d)
	}
	v, err := WrapVolume(s, a.F32)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func newRuntime(t testing.TB) *runtime.Runtime {
	t.Helper()
	rt, err := runtime.New(runtime.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := rt.Close(); err != nil {
			t.Errorf("close runtime: %v", err)
		}
	})
	return rt
}

func loadFixtureModel(t testing.TB, fx *parity.Fixture, rt *runtime.Runtime) *Model {
	return loadFixtureModelAs(t, fx, rt, 0)
}

// loadFixtureModelAs loads the fixture's vae with activations in act (0: f32).
func loadFixtureModelAs(t testing.TB, fx *parity.Fixture, rt *runtime.Runtime, act runtime.DType) *Model {
	t.Helper()
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(rt, dir, Options{DType: act})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.Close)
	return m
}

// TestParityVAE runs every case of the vae fixture in process (the worker's test runs them
// through the worker binary and shared memory); a fixture without a model case fails it.
func TestParityVAE(t *testing.T) { parityVAE(t, runtime.F32) }

// TestParityVAEHalf runs every case with fp16 activations (FramePack's vae dtype, or the
// 16-bit one $FRAMEPACK_ACTIVATION_DTYPE names; f32 accumulation, on the cpu through f32
// stand-ins): within parity.HalfRelL2 of the reference.
func TestParityVAEHalf(t *testing.T) { parityVAE(t, halfDType(t, "fp16")) }

// halfDType is the activation dtype of a half parity run (parity.HalfActivations).
func halfDType(t testing.TB, def string) runtime.DType {
	dt, err := runtime.ParseActivationDType(parity.HalfActivations(def))
	if err != nil {
		t.Fatal(err)
	}
	return dt
}

func parityVAE(t *testing.T, act runtime.DType) {
	fx := parity.Load(t, "vae")
	rt := newRuntime(t)
	var m *Model
	for _, c := range fx.Cases {
		if c.Op == "vae.encode" || c.Op == "vae.decode" {
			m = loadFixtureModelAs(t, fx, rt, act)
			break
		}
	}
	ran := 0 // model cases run
	for _, c := range fx.Cases {
		c = c.ForActivations(act != runtime.F32)
		t.Run(c.Name, func(t *testing.T) {
			switch c.Op {
			case "vae.encode":
				ran++
				x := volumeOf(t, c.Input(t, "x"))
				mean, logvar, err := m.Encode(t.Context(), x, RunOptions{Tiling: tilingFromParams(t, c)})
				if err != nil {
					t.Fatal(err)
				}
				c.Check(t, "mean", mean.Data, mean.ShapeInt64(), c.Output(t, "mean"))
				if c.HasOutput("logvar") {
					c.Check(t, "logvar", logvar.Data, logvar.ShapeInt64(), c.Output(t, "logvar"))
				}
			case "vae.decode":
				ran++
				z := volumeOf(t, c.Input(t, "z"))
				out, err := m.Decode(t.Context(), z, RunOptions{Tiling: tilingFromParams(t, c)})
				if err != nil {
					t.Fatal(err)
				}
				c.Check(t, "sample", out.Data, out.ShapeInt64(), c.Output(t, "sample"))
			case "vae.decode_fake":
				z := volumeOf(t, c.Input(t, "z"))
				out, err := DecodeFake(z)
				if err != nil {
					t.Fatal(err)
				}
				c.Check(t, "sample", out.Data, out.ShapeInt64(), c.Output(t, "sample"))
			default:
				t.Fatalf("case %s: unknown op %q", c.Name, c.Op)
			}
		})
	}
	if ran == 0 {
		t.Fatal("no vae.encode or vae.decode case ran")
	}
}
