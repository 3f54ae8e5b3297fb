package causalvae

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

func randomVolume(s [5]int, seed uint64) Volume {
	rng := rand.New(rand.NewPCG(seed, 3))
	v := NewVolume(s)
	for i := range v.Data {
		v.Data[i] = float32(rng.Float64()*2 - 1)
	}
	return v
}

// TestOtherConfigs checks configs the fixture set does not have (block counts, channels,
// groups, ratios, in/out channels, batch, mid-block attention off) against the float64
// reference written from the diffusers source.
func TestOtherConfigs(t *testing.T) {
	base := DefaultConfig()
	for _, tc := range []struct {
		name string
		edit func(c *Config)
		x, z [5]int
	}{
		{"three blocks ratio 4 one layer", func(c *Config) {
			c.BlockOutChannels = []int{8, 16, 16}
			c.DownBlockTypes, c.UpBlockTypes = c.DownBlockTypes[:3], c.UpBlockTypes[:3]
			c.LayersPerBlock, c.NormNumGroups, c.LatentChannels, c.SpatialCompressionRatio = 1, 4, 4, 4
		}, [5]int{1, 3, 5, 12, 16}, [5]int{1, 4, 3, 3, 4}},
		{"no attention grey in two out batch 2", func(c *Config) {
			c.BlockOutChannels = []int{8, 8, 16, 16}
			c.NormNumGroups, c.LatentChannels, c.InChannels, c.OutChannels = 8, 4, 1, 2
			c.MidBlockAddAttention = false
		}, [5]int{2, 1, 9, 16, 24}, [5]int{2, 4, 2, 2, 3}},
		{"ratio 16 downsamples in the last block", func(c *Config) {
			c.BlockOutChannels = []int{8, 8, 8, 8}
			c.NormNumGroups, c.LatentChannels, c.SpatialCompressionRatio, c.LayersPerBlock = 4, 4, 16, 1
		}, [5]int{1, 3, 1, 32, 48}, [5]int{1, 4, 2, 2, 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			cfg.DownBlockTypes = append([]string(nil), base.DownBlockTypes...)
			cfg.UpBlockTypes = append([]string(nil), base.UpBlockTypes...)
			tc.edit(&cfg)
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			ck, err := randomCheckpoint(cfg, 1)
			if err != nil {
				t.Fatal(err)
			}
			rt := newRuntime(t)
			m, err := LoadFrom(rt, cfg, ck, Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			if len(m.Info.Unexpected) != 0 {
				t.Fatalf("unexpected tensors %v", m.Info.Unexpected)
			}
			ref := newRefVAE(cfg, ck)
			opts := RunOptions{Tiling: DefaultTiling()}

			x := randomVolume(tc.x, 2)
			mean, logvar, err := m.Encode(t.Context(), x, opts)
			if err != nil {
				t.Fatal(err)
			}
			mom := ref.encode(arrOf(x))
			L := cfg.LatentChannels
			wantShape := [5]int{mom.s[0], L, mom.s[2], mom.s[3], mom.s[4]}
			if mean.Shape != wantShape || logvar.Shape != wantShape {
				t.Fatalf("encode shapes %v %v, reference %v", mean.Shape, logvar.Shape, wantShape)
			}
			wm, wl := NewVolume(wantShape), NewVolume(wantShape)
			copyRegion(wm, [5]int{}, Volume{Shape: mom.s, Data: mom.float32s()}, [5]int{}, wantShape)
			copyRegion(wl, [5]int{}, Volume{Shape: mom.s, Data: mom.float32s()}, [5]int{0, L, 0, 0, 0}, wantShape)
			for i := range wl.Data {
				wl.Data[i] = min(max(wl.Data[i], -30), 20)
			}
			for _, c := range []struct {
				name      string
				got, want []float32
			}{{"mean", mean.Data, wm.Data}, {"logvar", logvar.Data, wl.Data}} {
				e := parity.RelL2(c.got, c.want)
				t.Logf("encode %s %v: rel_l2 %.3g", c.name, wantShape, e)
				if !(e < 1e-5) {
					t.Errorf("encode %s: rel_l2 %g", c.name, e)
				}
			}

			z := randomVolume(tc.z, 3)
			out, err := m.Decode(t.Context(), z, opts)
			if err != nil {
				t.Fatal(err)
			}
			want := ref.decode(arrOf(z))
			if out.Shape != want.s {
				t.Fatalf("decode shape %v, reference %v", out.Shape, want.s)
			}
			e := parity.RelL2(out.Data, want.float32s())
			t.Logf("decode %v: rel_l2 %.3g", out.Shape, e)
			if !(e < 1e-5) {
				t.Errorf("decode: rel_l2 %g", e)
			}
		})
	}
}

// TestConfigValidate refuses what diffusers (or this implementation) cannot build, with a
// message that names the key.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name, json, want string
	}{
		{"defaults", `{}`, ""},
		{"fixture-like", `{"block_out_channels": [32, 32, 64, 64], "mid_block_add_attention": false}`, ""},
		{"class", `{"_class_name": "AutoencoderKL"}`, "_class_name"},
		{"act", `{"act_fn": "gelu"}`, "act_fn"},
		{"temporal 8", `{"temporal_compression_ratio": 8}`, "temporal_compression_ratio"},
		{"spatial 6", `{"spatial_compression_ratio": 6}`, "power of two"},
		{"spatial 32 with 4 blocks", `{"spatial_compression_ratio": 32}`, "spatial_compression_ratio"},
		{"two blocks", `{"spatial_compression_ratio": 4, "block_out_channels": [32, 32], "down_block_types": ["HunyuanVideoDownBlock3D", "HunyuanVideoDownBlock3D"], "up_block_types": ["HunyuanVideoUpBlock3D", "HunyuanVideoUpBlock3D"]}`, "temporal_compression_ratio"},
		{"groups", `{"block_out_channels": [128, 256, 512, 500]}`, "norm_num_groups"},
		{"block type", `{"down_block_types": ["DownEncoderBlock2D", "HunyuanVideoDownBlock3D", "HunyuanVideoDownBlock3D", "HunyuanVideoDownBlock3D"]}`, "down_block_types[0]"},
		{"lengths", `{"block_out_channels": [128, 256, 512]}`, "block_out_channels"},
		{"layers", `{"layers_per_block": 0}`, "layers_per_block"},
		{"unknown key", `{"shift_factor": 0.1}`, "shift_factor"},
		{"private key", `{"_use_default_values": ["x"]}`, ""},
		{"scaling", `{"scaling_factor": 0}`, "scaling_factor"},
		{"bad json", `{"block_out_channels": "x"}`, "parse config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseConfig([]byte(tc.json))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one mentioning %q", err, tc.want)
			}
		})
	}
}

// writeModel writes a model folder: config text and F16 tensors (as the release stores them).
func writeModel(t *testing.T, config string, ts []safetensors.Tensor) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := safetensors.WriteFile(filepath.Join(dir, "diffusion_pytorch_model.safetensors"), ts, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// fixtureTensors reads the fixture VAE's tensors and config.
func fixtureTensors(t *testing.T) (string, []safetensors.Tensor) {
	t.Helper()
	fx := parity.Load(t, "vae")
	dir, err := fx.ModelPath("vae")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	f, err := safetensors.Open(filepath.Join(dir, "diffusion_pytorch_model.safetensors"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var ts []safetensors.Tensor
	for _, n := range f.Names() {
		info, _ := f.Info(n)
		b, err := f.Bytes(n)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, safetensors.Tensor{Name: n, DType: info.DType, Shape: append([]int64(nil), info.Shape...), Data: append([]byte(nil), b...)})
	}
	return string(cfg), ts
}

// TestLoadErrors checks that a corrupt or mismatched checkpoint fails Load with an error that
// names the tensor (errors.Is ErrCheckpoint), and leaves nothing allocated.
func TestLoadErrors(t *testing.T) {
	cfg, ts := fixtureTensors(t)
	const victim = "encoder.down_blocks.2.resnets.0.conv1.conv.weight"
	without := func(name string) []safetensors.Tensor {
		var out []safetensors.Tensor
		for _, x := range ts {
			if x.Name != name {
				out = append(out, x)
			}
		}
		return out
	}
	reshaped := func(name string, shape []int64) []safetensors.Tensor {
		out := append([]safetensors.Tensor(nil), ts...)
		for i, x := range out {
			if x.Name == name {
				x.Shape = shape
				out[i] = x
			}
		}
		return out
	}
	var victimShape []int64
	for _, x := range ts {
		if x.Name == victim {
			victimShape = x.Shape
		}
	}
	if victimShape == nil {
		t.Skipf("fixture checkpoint has no %s", victim)
	}
	// same bytes, other dims: a transposed conv weight
	swapped := append([]int64(nil), victimShape...)
	swapped[0], swapped[1] = swapped[1], swapped[0]
	for _, tc := range []struct {
		name   string
		config string
		ts     []safetensors.Tensor
		want   string
	}{
		{"missing tensor", cfg, without(victim), victim + ": missing"},
		{"wrong shape", cfg, reshaped(victim, swapped), victim + ": got shape"},
		{"config says more latent channels", strings.Replace(cfg, `"latent_channels": 16`, `"latent_channels": 8`, 1), ts, "quant_conv.weight: got shape"},
		{"config says more layers", strings.Replace(cfg, `"layers_per_block": 2`, `"layers_per_block": 3`, 1), ts, "encoder.down_blocks.0.resnets.2.norm1.weight: missing"},
		{"config without attention keeps weights", strings.Replace(cfg, `"mid_block_add_attention": true`, `"mid_block_add_attention": false`, 1), ts, ""},
		{"bad config", strings.Replace(cfg, `"silu"`, `"relu"`, 1), ts, "act_fn"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.config == cfg && tc.name != "missing tensor" && tc.name != "wrong shape" {
				t.Fatalf("config edit did not apply")
			}
			dir := writeModel(t, tc.config, tc.ts)
			rt := newRuntime(t)
			m, err := Load(rt, dir, Options{})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				defer m.Close()
				if len(m.Info.Unexpected) == 0 {
					t.Fatal("attention weights not reported as unexpected")
				}
				return
			}
			if err == nil {
				m.Close()
				t.Fatalf("loaded; want an error mentioning %q", tc.want)
			}
			if !errors.Is(err, ErrCheckpoint) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want ErrCheckpoint mentioning %q", err, tc.want)
			}
			if mem := rt.Memory(); mem.Allocated != 0 || mem.LiveTensors != 0 {
				t.Fatalf("failed load left %d bytes in %d tensors", mem.Allocated, mem.LiveTensors)
			}
		})
	}

	t.Run("truncated file", func(t *testing.T) {
		dir := writeModel(t, cfg, ts)
		p := filepath.Join(dir, "diffusion_pytorch_model.safetensors")
		st, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(p, st.Size()/2); err != nil {
			t.Fatal(err)
		}
		_, err = Load(newRuntime(t), dir, Options{})
		if !errors.Is(err, ErrCheckpoint) {
			t.Fatalf("truncated checkpoint: %v", err)
		}
	})
	t.Run("no checkpoint", func(t *testing.T) {
		dir := t.TempDir()
		os.WriteFile(filepath.Join(dir, "config.json"), []byte(cfg), 0o644)
		if _, err := Load(newRuntime(t), dir, Options{}); !errors.Is(err, ErrCheckpoint) {
			t.Fatalf("no checkpoint: %v", err)
		}
	})
}

// TestBadInput checks that inputs of the wrong channel count, empty dims or bad tiling fail
// with ErrBadInput before any compute.
func TestBadInput(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockOutChannels = []int{8, 8, 8, 8}
	cfg.NormNumGroups = 4
	ck, err := randomCheckpoint(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	m, err := LoadFrom(newRuntime(t), cfg, ck, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	tiny := DefaultTiling()
	tiny.Spatial = true
	tiny.TileSampleMinHeight, tiny.TileSampleStrideHeight = 16, 32
	for _, tc := range []struct {
		name   string
		encode bool
		shape  [5]int
		tiling Tiling
	}{
		{"latent channels", false, [5]int{1, 8, 1, 2, 2}, DefaultTiling()},
		{"pixel channels", true, [5]int{1, 4, 1, 8, 8}, DefaultTiling()},
		{"empty dim", false, [5]int{1, 16, 0, 2, 2}, DefaultTiling()},
		{"stride over tile", false, [5]int{1, 16, 1, 8, 8}, tiny},
		{"zero frame stride", false, [5]int{1, 16, 1, 2, 2}, Tiling{FramewiseDecoding: true, TileSampleMinNumFrames: 16, TileSampleStrideNumFrames: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := NewVolume(tc.shape)
			if tc.encode {
				_, _, err = m.Encode(t.Context(), v, RunOptions{Tiling: tc.tiling})
			} else {
				_, err = m.Decode(t.Context(), v, RunOptions{Tiling: tc.tiling})
			}
			if !errors.Is(err, ErrBadInput) {
				t.Fatalf("got %v, want ErrBadInput", err)
			}
		})
	}
	if _, err := DecodeFake(NewVolume([5]int{1, 4, 1, 2, 2})); !errors.Is(err, ErrBadInput) {
		t.Fatalf("preview of 4 channels: %v", err)
	}
}

// TestBlend pins the blend arithmetic: b[k] = a[n−e+k]·(1−k/e) + b[k]·k/e, e clipped to both
// lengths.
func TestBlend(t *testing.T) {
	a := NewVolume([5]int{1, 1, 1, 1, 5})
	b := NewVolume([5]int{1, 1, 1, 1, 3})
	copy(a.Data, []float32{0, 0, 10, 20, 30})
	copy(b.Data, []float32{100, 100, 100})
	if err := blend(a, b, 4, 4); err != nil {
		t.Fatal(err)
	}
	// e = min(5, 3, 4) = 3: b[0] = a[2]; b[1] = a[3]·2/3 + 100/3; b[2] = a[4]/3 + 200/3
	want := []float32{10, 20*2.0/3 + 100.0/3, 30.0/3 + 200.0/3}
	for i := range want {
		if math.Abs(float64(b.Data[i]-want[i])) > 1e-5 {
			t.Fatalf("blend %v, want %v", b.Data, want)
		}
	}
	if err := blend(a, NewVolume([5]int{1, 2, 1, 1, 3}), 4, 2); err == nil {
		t.Fatal("blend of mismatched channels accepted")
	}
}

// TestPlanShapes pins the tiling arithmetic on shapes diffusers' loops give: output lengths,
// tile counts, and crops of tiles that do not divide the input.
func TestPlanShapes(t *testing.T) {
	cfg := DefaultConfig()
	m := &Model{Config: cfg}
	spatial := func(tile, stride int) Tiling {
		t := DefaultTiling()
		t.Spatial = true
		t.TileSampleMinHeight, t.TileSampleMinWidth, t.TileSampleStrideHeight, t.TileSampleStrideWidth = tile, tile, stride, stride
		return t
	}
	for _, tc := range []struct {
		name   string
		encode bool
		in     [5]int
		tiling Tiling
		out    [5]int
		runs   int
	}{
		// FramePack 640 bucket: 544×704 px, 9 latent frames per section.
		{"decode 544x704 256 px", false, [5]int{1, 16, 9, 68, 88}, spatial(256, 192), [5]int{1, 3, 33, 544, 704}, 3 * 12},
		{"decode 544x704 128 px", false, [5]int{1, 16, 9, 68, 88}, spatial(128, 96), [5]int{1, 3, 33, 544, 704}, 3 * 48},
		{"decode 544x704 64 px", false, [5]int{1, 16, 9, 68, 88}, spatial(64, 48), [5]int{1, 3, 33, 544, 704}, 3 * 12 * 15},
		{"decode framewise only", false, [5]int{1, 16, 9, 68, 88}, DefaultTiling(), [5]int{1, 3, 33, 544, 704}, 3},
		{"decode 4 frames stays whole", false, [5]int{1, 16, 4, 8, 8}, DefaultTiling(), [5]int{1, 3, 13, 64, 64}, 1},
		{"decode 5 frames", false, [5]int{1, 16, 5, 8, 8}, DefaultTiling(), [5]int{1, 3, 17, 64, 64}, 2},
		{"encode image 544x704 256 px", true, [5]int{1, 3, 1, 544, 704}, spatial(256, 192), [5]int{1, 32, 1, 68, 88}, 12},
		{"encode 17 frames framewise", true, [5]int{1, 3, 17, 64, 64}, DefaultTiling(), [5]int{1, 32, 5, 8, 8}, 2},
		{"encode 16 frames whole", true, [5]int{1, 3, 16, 64, 64}, DefaultTiling(), [5]int{1, 32, 4, 8, 8}, 1},
		{"encode 25 frames, last chunk empty", true, [5]int{1, 3, 25, 64, 64}, DefaultTiling(), [5]int{1, 32, 7, 8, 8}, 2},
		{"encode odd size floors", true, [5]int{1, 3, 1, 60, 70}, spatial(32, 24), [5]int{1, 32, 1, 7, 8}, 3 * 3},
		{"encode odd size untiled ceils", true, [5]int{1, 3, 1, 60, 70}, DefaultTiling(), [5]int{1, 32, 1, 8, 9}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := m.makePlan(tc.in, tc.tiling, tc.encode)
			if err != nil {
				t.Fatal(err)
			}
			if p.out != tc.out || p.runs != tc.runs {
				t.Fatalf("plan out %v runs %d, want %v runs %d", p.out, p.runs, tc.out, tc.runs)
			}
		})
	}
}

// TestFailureFreesEverything stops decodes midway (cancelled context, a failing progress
// callback, the memory cap) and checks that the runtime holds only the weights afterwards.
func TestFailureFreesEverything(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BlockOutChannels = []int{8, 8, 16, 16}
	cfg.NormNumGroups = 4
	ck, err := randomCheckpoint(cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	rt := newRuntime(t)
	m, err := LoadFrom(rt, cfg, ck, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	weights := rt.Memory()
	z := randomVolume([5]int{1, 16, 6, 4, 4}, 5) // two temporal chunks
	tl := DefaultTiling()
	tl.Spatial = true
	tl.TileSampleMinHeight, tl.TileSampleMinWidth, tl.TileSampleStrideHeight, tl.TileSampleStrideWidth = 16, 16, 16, 16
	stop := errors.New("stop")
	for _, tc := range []struct {
		name string
		run  func() error
		want error
	}{
		{"cancelled", func() error {
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			_, err := m.Decode(ctx, z, RunOptions{Tiling: tl})
			return err
		}, context.Canceled},
		{"progress error", func() error {
			_, err := m.Decode(t.Context(), z, RunOptions{Tiling: tl, Progress: func(done, total int) error {
				if done == 3 {
					return stop
				}
				return nil
			}})
			return err
		}, stop},
		{"memory cap", func() error {
			// half the untiled peak: the decode fails somewhere in the middle
			peak, _, _ := decodePeak(t, m, z, DefaultTiling())
			if err := rt.SetMemoryCap(int64(weights.Allocated + peak/2)); err != nil {
				t.Fatal(err)
			}
			defer rt.SetMemoryCap(0)
			_, err := m.Decode(t.Context(), z, RunOptions{Tiling: DefaultTiling()})
			return err
		}, runtime.ErrOutOfMemory},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.run(); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if mem := rt.Memory(); mem.Allocated != weights.Allocated || mem.LiveTensors != weights.LiveTensors {
				t.Fatalf("after failure: %d bytes in %d tensors, the weights are %d in %d", mem.Allocated,
					mem.LiveTensors, weights.Allocated, weights.LiveTensors)
			}
		})
	}
}
