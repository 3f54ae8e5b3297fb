package pipeline

import (
	"strings"
	"testing"

	"github.com/framepackd/framepackd/supervisor/lanes"
)

// TestPlanSection checks the section loop's residency plan at the full-size model's estimates
// (H200 run of 2026-11-29: transformer fastest 20.6 GiB, all blocks streamed 2.6 GiB; VAE decode
// fastest 8.2 GiB, smallest tiles 0.5 GiB) on the budgets of the end-to-end benchmark.
func TestPlanSection(t *testing.T) {
	const gb = uint64(1) << 30
	tr := &lanes.Need{Min: 26 * gb / 10, Full: 206 * gb / 10}
	vae := &lanes.Need{Min: gb / 2, Full: 822 * gb / 100}
	overhead := uint64(512 << 20)
	for _, c := range []struct {
		budget   uint64
		keep     bool
		why      string
		fastestT bool
	}{
		{budget: 140 * gb, keep: true, why: "at their fastest", fastestT: true},
		{budget: 24 * gb, keep: true, why: "budget split"},
		{budget: 16 * gb, keep: true, why: "budget split"},
		{budget: 8 * gb, keep: false, why: "under half of its fastest tiling"},
		{budget: 6 * gb, keep: false, why: "under half of its fastest tiling"},
		{budget: 3 * gb, keep: false, why: "do not fit"},
		{budget: 0, keep: false, why: "unknown"},
	} {
		p := planSection(tr, vae, c.budget, overhead)
		if p.keep != c.keep || !strings.Contains(p.why, c.why) {
			t.Errorf("budget %.0f GiB: keep %v (%s), want keep %v (%q)", gib(c.budget), p.keep, p.why, c.keep, c.why)
			continue
		}
		if !p.keep {
			if p.transformer != 0 || p.vae != 0 {
				t.Errorf("budget %.0f GiB: caps %d/%d for workers that are not kept", gib(c.budget), p.transformer, p.vae)
			}
			continue
		}
		if p.transformer+p.vae+overhead > c.budget {
			t.Errorf("budget %.0f GiB: caps %.2f + %.2f GiB do not fit", gib(c.budget), gib(p.transformer), gib(p.vae))
		}
		if p.vae < vae.Cap()/2 {
			t.Errorf("budget %.0f GiB: the vae kept at %.2f GiB, under half its fastest", gib(c.budget), gib(p.vae))
		}
		if c.fastestT && p.transformer != tr.Cap() {
			t.Errorf("budget %.0f GiB: transformer cap %.2f, want its fastest %.2f", gib(c.budget), gib(p.transformer), gib(tr.Cap()))
		}
	}
	if p := planSection(nil, vae, 16*gb, overhead); p.keep {
		t.Errorf("kept without the transformer's estimate: %s", p.why)
	}
}
