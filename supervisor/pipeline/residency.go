package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/sirupsen/logrus"

	"github.com/framepackd/framepackd/internal/workerkit"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// Which workers stay alive, decided from what each worker says its model needs before it
// loads (lanes.Lane.Estimate) and the job's budget on the lane; see supervisor/lanes for how
// the lane enforces it. Every stage asks to be kept (with residency on); the lane keeps a
// worker only while the caps of the live workers fit the budget together, so where memory is
// contested each worker is killed before the next stage spawns, as the design asks. The section
// loop's pair (transformer and VAE, which alternate every section) gets a plan before its first
// section: both at their fastest when that fits, else the budget split between them (the
// transformer streams more blocks, the VAE decodes in tiles) when both still fit and the VAE
// keeps at least half of its fastest tiling's memory, else neither is kept and each stage has
// the whole budget.

// sectionPlan is the residency plan of the section loop.
type sectionPlan struct {
	// transformer and vae are the caps of the pair's stages (0: the lane decides from the
	// stage's estimate, or gives the whole budget without one).
	transformer, vae uint64
	// keep says the pair stays alive between sections.
	keep bool
	// why says so in words (stage records and the log).
	why string
}

// planSection splits budget between the transformer (needing t) and the VAE (needing v), each
// live worker beyond the first costing overhead.
func planSection(t, v *lanes.Need, budget, overhead uint64) sectionPlan {
	switch {
	case budget == 0:
		return sectionPlan{why: "the lane's memory is unknown: the transformer and the vae are killed after each stage"}
	case t == nil || v == nil:
		return sectionPlan{why: "no memory estimate from the transformer or the vae: both killed after each stage"}
	}
	tFull, vFull, tMin, vMin := t.Cap(), v.Cap(), t.MinCap(), v.MinCap()
	if tFull+vFull+overhead <= budget {
		return sectionPlan{transformer: tFull, vae: vFull, keep: true, why: fmt.Sprintf(
			"transformer and vae kept between sections at their fastest (%.2f + %.2f GiB of %.2f GiB)", gib(tFull), gib(vFull), gib(budget))}
	}
	if tMin+vMin+overhead <= budget {
		// The VAE gets up to its fastest tiling, the transformer the rest (at least all of its
		// blocks streamed): streaming more blocks costs the transformer little, smaller tiles
		// cost the decode more.
		vc := min(vFull, budget-overhead-tMin)
		tc := min(budget-overhead-vc, tFull)
		if vc < vFull/2 {
			// Small tiles cost the decode more than a reload costs the transformer: on an H200
			// at a 6 GiB lane the decode beside the kept transformer (1.02 GiB) took 8.8 s a
			// section against 2.1–2.9 s at its fastest tiling, while the transformer's reload
			// from the page cache took 2.4 s (docs/bench/2026-11-29-h200-e2e.json).
			return sectionPlan{why: fmt.Sprintf(
				"the vae would decode in %.2f GiB beside the transformer's %.2f GiB, under half of its fastest tiling's %.2f GiB: each killed after its stage, with the whole %.2f GiB budget",
				gib(vc), gib(tc), gib(vFull), gib(budget))}
		}
		return sectionPlan{transformer: tc, vae: vc, keep: true, why: fmt.Sprintf(
			"transformer and vae kept between sections, the %.2f GiB budget split: transformer %.2f GiB (fastest %.2f), vae %.2f GiB (fastest %.2f)",
			gib(budget), gib(tc), gib(tFull), gib(vc), gib(vFull))}
	}
	return sectionPlan{why: fmt.Sprintf("transformer (at least %.2f GiB) and vae (at least %.2f GiB) do not fit the %.2f GiB budget together: each killed after its stage",
		gib(tMin), gib(vMin), gib(budget))}
}

func gib(b uint64) float64 { return float64(b) / (1 << 30) }

// need asks the lane for st's estimate, nil when the worker has none or it fails (the stage
// then runs with the whole budget; the failure is the stage's to report when it loads).
func (j *jobRun) need(ctx context.Context, st lanes.Stage, decodeFrames uint32) *lanes.Need {
	if j.memCap == 0 {
		return nil // nothing to plan against
	}
	n, err := j.lane.Estimate(ctx, st, decodeFrames)
	if err != nil {
		f := j.log.WithError(err).WithField("worker", string(st.Model))
		if errors.Is(err, workerkit.ErrNoEstimate) {
			f.Debug("no memory estimate")
		} else {
			f.Warn("memory estimate failed; the stage gets the whole budget")
		}
		return nil
	}
	return &n
}

// maxDecodeFrames is the most latent frames one decode of a job of window w takes (the last
// section's, with the start latent).
func maxDecodeFrames(w int) uint32 { return uint32(plan.DecodeFrames(w, true)) }

// planResidency asks the section pair's workers for their estimates (concurrently: each is a
// throwaway process) and plans the section loop, once per run of the job, before its first
// section. The encoders' estimates come before their own stages (encode.go).
func (j *jobRun) planResidency(ctx context.Context) {
	if j.section0 != nil {
		return
	}
	var t, v *lanes.Need
	if j.r.cfg.Residency {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); t = j.need(ctx, j.transformerStage(nil), 0) }()
		go func() { defer wg.Done(); v = j.need(ctx, j.decodeStage(nil), maxDecodeFrames(j.window)) }()
		wg.Wait()
	}
	p := planSection(t, v, j.memCap, j.lane.WorkerOverhead())
	if !j.r.cfg.Residency {
		p = sectionPlan{why: "residency off: every worker killed after its stage"}
	}
	j.section0 = &p
	f := logrus.Fields{"budget": j.memCap, "transformer_cap": p.transformer, "vae_cap": p.vae, "keep": p.keep}
	if t != nil {
		f["transformer_min"], f["transformer_full"] = t.Min, t.Full
	}
	if v != nil {
		f["vae_min"], f["vae_full"] = v.Min, v.Full
	}
	j.log.WithFields(f).Info("residency: " + p.why)
}
