package causalvae

import (
	"fmt"
	"testing"
	"time"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/runtime"
)

// decodePeak decodes z and returns the runtime's peak bytes above what it held before (the
// weights), the time taken and the output.
func decodePeak(tb testing.TB, m *Model, z Volume, t Tiling) (uint64, time.Duration, Volume) {
	tb.Helper()
	rt := m.Runtime()
	if err := rt.ResetPeak(); err != nil {
		tb.Fatal(err)
	}
	base := rt.Memory().Allocated
	start := time.Now()
	out, err := m.Decode(tb.Context(), z, RunOptions{Tiling: t})
	if err != nil {
		tb.Fatal(err)
	}
	el := time.Since(start)
	mem := rt.Memory()
	if mem.Allocated != base {
		tb.Fatalf("decode leaked %d bytes", int64(mem.Allocated)-int64(base))
	}
	return mem.Peak - base, el, out
}

func peakModel(tb testing.TB) *Model {
	tb.Helper()
	fx := parity.Load(tb, "vae")
	rt, err := runtime.New(runtime.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { rt.Close() })
	return loadFixtureModel(tb, fx, rt)
}

// peakTilings are the tilings compared: framewise chunks only, and chunks split into spatial
// tiles of 3 latents with a stride of 2.
func peakTilings(c Config) map[string]Tiling {
	sc := c.SpatialCompressionRatio
	sp := DefaultTiling()
	sp.Spatial = true
	sp.TileSampleMinHeight, sp.TileSampleMinWidth = 3*sc, 3*sc
	sp.TileSampleStrideHeight, sp.TileSampleStrideWidth = 2*sc, 2*sc
	return map[string]Tiling{"framewise": DefaultTiling(), "framewise+spatial": sp}
}

// TestTiledDecodePeakBounded decodes latents of two lengths with the same tiles: the runtime's
// peak must not grow with the video (it holds one chunk's or tile's activations at a time),
// while the output does.
func TestTiledDecodePeakBounded(t *testing.T) {
	m := peakModel(t)
	c := m.Config
	// The short video is one full temporal chunk and a bit (the chunk is tile/4+1 latents); the
	// long one has three more chunks.
	t.Logf("temporal chunk: %d latent frames", DefaultTiling().TileSampleMinNumFrames/c.TemporalCompressionRatio+1)
	short, long := 5, 11
	peaks := map[string]uint64{}
	for name, tl := range peakTilings(c) {
		var p [2]uint64
		for i, T := range []int{short, long} {
			z := randomVolume([5]int{1, c.LatentChannels, T, 4, 6}, uint64(T))
			peak, el, out := decodePeak(t, m, z, tl)
			t.Logf("%s: %d latent frames → %v: peak %d bytes above the weights, output %d bytes, %v", name, T,
				out.Shape, peak, 4*len(out.Data), el.Round(time.Millisecond))
			p[i] = peak
		}
		if p[1] > p[0] {
			t.Errorf("%s: peak grew with the video: %d bytes for %d frames, %d for %d", name, p[1], long, p[0], short)
		}
		peaks[name] = p[1]
	}
	if !(peaks["framewise+spatial"] < peaks["framewise"]) {
		t.Errorf("spatial tiles did not lower the peak: %v", peaks)
	}
}

// BenchmarkTiledDecode decodes the same latents at two lengths with the same tiles and reports
// the runtime's peak bytes above the weights (peak-B), the output size (out-B) and the time.
func BenchmarkTiledDecode(b *testing.B) {
	m := peakModel(b)
	c := m.Config
	for name, tl := range peakTilings(c) {
		for _, T := range []int{5, 17} {
			z := randomVolume([5]int{1, c.LatentChannels, T, 8, 12}, uint64(T))
			b.Run(fmt.Sprintf("%s/frames=%d", name, T), func(b *testing.B) {
				var peak uint64
				var out Volume
				for b.Loop() {
					peak, _, out = decodePeak(b, m, z, tl)
				}
				b.ReportMetric(float64(peak), "peak-B")
				b.ReportMetric(float64(4*len(out.Data)), "out-B")
			})
		}
	}
}
