package dit

import (
	"context"
	"math"
	"slices"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
)

// TestOtherConfigs runs configs other than the fixture's (random weights): the output has the
// right size, is finite and deterministic, and TeaCache's skip path (a repeated input: relative
// change 0, rescaled 0.096 < 0.15) reproduces the computed output from the cached residual.
func TestOtherConfigs(t *testing.T) {
	base := Config{ClassName: ClassName, InChannels: 16, OutChannels: 16, NumAttentionHeads: 3, AttentionHeadDim: 8,
		NumLayers: 1, NumSingleLayers: 1, NumRefinerLayers: 1, MLPRatio: 4, PatchSize: 2, PatchSizeT: 1,
		QKNorm: "rms_norm", GuidanceEmbeds: true, TextEmbedDim: 12, PooledProjectionDim: 10, RopeTheta: 256,
		RopeAxesDim: [3]int{2, 2, 4}, HasImageProj: true, ImageProjDim: 20, HasCleanXEmbedder: true}
	tests := []struct {
		name string
		edit func(c *Config)
	}{
		{"3 heads of 8", func(*Config) {}},
		{"no clean embedder, no image projection", func(c *Config) { c.HasCleanXEmbedder, c.HasImageProj = false, false }},
		{"double blocks only, no refiner blocks", func(c *Config) { c.NumSingleLayers, c.NumRefinerLayers = 0, 0 }},
		{"three single blocks, mlp ratio 2.5", func(c *Config) { c.NumSingleLayers, c.MLPRatio = 3, 2.5 }},
		{"patch 1, 8 output channels", func(c *Config) {
			c.PatchSize, c.OutChannels, c.HasCleanXEmbedder, c.InChannels = 1, 8, false, 4
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.edit(&cfg)
			rt := newTestRuntime(t)
			m, err := New(rt, cfg, nil, LoadOptions{RandomWeights: true, Seed: 3})
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			c, shape, x := randomConditioning(cfg, 3, 8, 12, 5, 4, 4)
			sec, err := m.Prepare(c, shape)
			if err != nil {
				t.Fatal(err)
			}
			defer sec.Close()
			tea := NewTeaCache(4, 0)
			defer tea.Close()
			var outs [][]float32
			for range 2 {
				v, err := m.Forward(context.Background(), sec, x, 500, 6000, ForwardOptions{TeaCache: tea})
				if err != nil {
					t.Fatal(err)
				}
				outs = append(outs, v)
			}
			plain, err := m.Forward(context.Background(), sec, x, 500, 6000, ForwardOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if want := cfg.OutChannelsOrIn() * shape[2] * shape[3] * shape[4]; len(plain) != want {
				t.Fatalf("%d values, want %d", len(plain), want)
			}
			for i, v := range plain {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("value %d is %v", i, v)
				}
			}
			if !slices.Equal(plain, outs[0]) {
				t.Errorf("computed TeaCache call differs from a plain forward")
			}
			if got := tea.Calls; len(got) != 2 || !got[0].Computed || got[1].Computed {
				t.Fatalf("TeaCache calls %+v, want computed then skipped", got)
			}
			d := parity.RelL2(outs[1], plain)
			t.Logf("%s: params %d, skipped forward rel_l2 vs computed %.3g", tc.name, m.NumParams(), d)
			if d > 1e-5 {
				t.Errorf("skipped forward differs from the computed one: rel_l2 %.3g", d)
			}
		})
	}
}
