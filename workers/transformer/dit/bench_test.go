package dit

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/workers/transformer/conditioning"
)

// MidConfig is the mid-size benchmark model: 4 double + 4 single blocks, 8 heads × 64, with the
// real model's conditioning widths (LLaMA 4096, CLIP 768, SigLIP 1152).
func MidConfig() Config {
	cfg := DefaultConfig()
	cfg.NumAttentionHeads, cfg.AttentionHeadDim = 8, 64
	cfg.NumLayers, cfg.NumSingleLayers = 4, 4
	cfg.RopeAxesDim = [3]int{16, 24, 24}
	cfg.HasImageProj, cfg.HasCleanXEmbedder = true, true
	return cfg
}

// randomConditioning is a FramePack section's conditioning for cfg at latent size h×w (in
// latent pixels) with a window of `window` latent frames: clean latents 1x (2 frames), 2x (2),
// 4x (16), SigLIP states of siglip tokens and text real tokens of 512 padded.
func randomConditioning(cfg Config, window, h, w, siglip, text int, seed uint64) (Conditioning, [5]int, []float32) {
	r := rand.New(rand.NewPCG(seed, 1))
	randn := func(shape ...int) conditioning.Tensor {
		n := 1
		for _, d := range shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		return conditioning.Tensor{Shape: shape, Data: v}
	}
	idx := func(from, n int) conditioning.IntTensor {
		v := make([]int64, n)
		for i := range v {
			v[i] = int64(from + i)
		}
		return conditioning.IntTensor{Shape: []int{1, n}, Data: v}
	}
	const padded = 512
	mask := make([]int64, padded)
	for i := range text {
		mask[i] = 1
	}
	c := Conditioning{
		EncoderHiddenStates:  randn(1, padded, cfg.TextEmbedDim),
		EncoderAttentionMask: conditioning.IntTensor{Shape: []int{1, padded}, Data: mask},
		PooledProjections:    randn(1, cfg.PooledProjectionDim),
		LatentIndices:        idx(1, window),
	}
	if cfg.HasImageProj {
		c.ImageEmbeddings = randn(1, siglip, cfg.ImageProjDim)
	}
	if cfg.HasCleanXEmbedder {
		c.CleanLatents = randn(1, 16, 2, h, w)
		c.CleanLatentIndices = conditioning.IntTensor{Shape: []int{1, 2}, Data: []int64{0, int64(window + 1)}}
		c.CleanLatents2x, c.CleanLatent2xIndices = randn(1, 16, 2, h, w), idx(window+2, 2)
		c.CleanLatents4x, c.CleanLatent4xIndices = randn(1, 16, 16, h, w), idx(window+4, 16)
	}
	shape := [5]int{1, cfg.InChannels, window, h, w}
	x := randn(shape[:]...)
	return c, shape, x.Data
}

// benchForward times one forward (Prepare excluded) and reports the runtime's peak bytes
// (weights included) and the weights' bytes.
func benchForward(b *testing.B, m *Model, c Conditioning, shape [5]int, x []float32) {
	sec, err := m.Prepare(c, shape)
	if err != nil {
		b.Fatal(err)
	}
	defer sec.Close()
	rt := m.Runtime()
	img, enc := sec.Tokens()
	if err := rt.ResetPeak(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := m.Forward(context.Background(), sec, x, 875, 10000, ForwardOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	mem := rt.Memory()
	b.ReportMetric(float64(mem.Peak), "peak-bytes")
	b.ReportMetric(float64(m.WeightBytes()), "weight-bytes")
	b.ReportMetric(float64(img+enc), "tokens")
	b.Logf("params %d, image tokens %d, encoder tokens %d, threads %d", m.NumParams(), img, enc, rt.Backend().Threads)
}

// BenchmarkForwardFixture is one forward of the fixture model on the fixture's first forward
// case.
func BenchmarkForwardFixture(b *testing.B) {
	fx := parity.Load(b, "transformer")
	rt, err := runtime.New(runtime.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	m := loadFixtureModel(b, rt, fx)
	var c parity.Case
	for _, fc := range fx.Cases {
		if fc.Op == OpForward {
			c = fc
			break
		}
	}
	fc := decodeForward(b, c)
	benchForward(b, m, fc.cond, [5]int(fc.x.Shape), fc.x.Data)
	m.Close()
}

// BenchmarkForwardMid is one forward of MidConfig with random weights on a 32×48 latent, window
// 9, 729 SigLIP tokens and 64 text tokens.
func BenchmarkForwardMid(b *testing.B) {
	rt, err := runtime.New(runtime.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer rt.Close()
	cfg := MidConfig()
	m, err := New(rt, cfg, nil, LoadOptions{RandomWeights: true, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	c, shape, x := randomConditioning(cfg, 9, 32, 48, 729, 64, 2)
	benchForward(b, m, c, shape, x)
}

// BenchmarkForwardStreaming is BenchmarkForwardMid's forward (on a 16×24 latent) with every
// block resident, half of them, one and none: resident and streamed blocks, the runtime's
// peak and the bytes copied per forward are reported beside the time. On cpu the copies are
// plain memcpys in the forward's thread; the overlap with compute is a GPU matter.
func BenchmarkForwardStreaming(b *testing.B) {
	cfg := MidConfig()
	c, shape, x := randomConditioning(cfg, 9, 16, 24, 729, 64, 2)
	for _, bc := range []struct {
		name     string
		resident int
	}{{"all", 0}, {"half", (cfg.NumLayers + cfg.NumSingleLayers) / 2}, {"one", 1}, {"none", NoResidentBlocks}} {
		b.Run(bc.name, func(b *testing.B) {
			rt, err := runtime.New(runtime.Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer rt.Close()
			m, err := New(rt, cfg, nil, LoadOptions{RandomWeights: true, Seed: 1, MaxResidentBlocks: bc.resident})
			if err != nil {
				b.Fatal(err)
			}
			defer m.Close()
			copied := m.CopiedBytes()
			benchForward(b, m, c, shape, x)
			b.ReportMetric(float64(m.ResidentBlocks()), "resident-blocks")
			b.ReportMetric(float64(m.StreamedBlocks()), "streamed-blocks")
			b.ReportMetric(float64(m.CopiedBytes()-copied)/float64(b.N), "copied-bytes/op")
		})
	}
}
