package watchdog

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// Knobs are the settings of one stage attempt that the degradation ladder turns. Zero values
// mean the lane's and the model's defaults.
type Knobs struct {
	// VAETilePx is the VAE's spatial tile size in pixels (0: untiled, the model's default).
	VAETilePx uint32
	// ResidentBlocks caps the transformer blocks kept on the device (0: as many as fit).
	ResidentBlocks uint32
	// MemoryCap caps the worker's device allocations (0: the lane's cap).
	MemoryCap uint64
	// Backend overrides the lane's backend ("cpu": the last rung for small stages).
	Backend string
	// ConvFirstTier makes every convolution start at this tier (0: the best available).
	ConvFirstTier workerkit.ConvTier
}

// String lists the knobs that are set.
func (k Knobs) String() string {
	s := ""
	add := func(f string, args ...any) {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf(f, args...)
	}
	if k.VAETilePx != 0 {
		add("vae tile %d px", k.VAETilePx)
	}
	if k.ResidentBlocks != 0 {
		add("%d resident blocks", k.ResidentBlocks)
	}
	if k.MemoryCap != 0 {
		add("memory cap %d bytes", k.MemoryCap)
	}
	if k.Backend != "" {
		add("backend %s", k.Backend)
	}
	if k.ConvFirstTier != workerkit.ConvTierUnspecified {
		add("conv from tier %d", k.ConvFirstTier)
	}
	if s == "" {
		return "defaults"
	}
	return s
}

// VAETiling returns the tiling of a VAE request for the knobs: base (nil: the model's
// defaults) with spatial tiles of VAETilePx and diffusers' 3/4 stride when the knob is set.
func (k Knobs) VAETiling(base *workerkit.VAETiling) *workerkit.VAETiling {
	if k.VAETilePx == 0 {
		return base
	}
	t := workerkit.VAETiling{}
	if base != nil {
		t = *base
	}
	t.EnableSpatialTiling = true
	t.TileSampleMinHeight, t.TileSampleMinWidth = k.VAETilePx, k.VAETilePx
	t.TileSampleStrideHeight, t.TileSampleStrideWidth = k.VAETilePx*3/4, k.VAETilePx*3/4
	return &t
}

// LastConvTier is the conv chain's last tier (runtime.TierCPU's name). A hang there is never
// marked in the decision cache: with it skipped no tier would be left to serve the shape, so
// the stage is retried as for any other hang.
const LastConvTier = "cpu"

// ConvMark is "shape Key hung at tier Tier", recorded in the conv decision cache.
type ConvMark struct {
	Key, Tier string
}

// Step is one rung of the ladder: the knobs of the next attempt and what changed.
type Step struct {
	Knobs Knobs
	// MarkHung, when set, is recorded in the decision cache before the next attempt.
	MarkHung *ConvMark
	// Change says what the next attempt changes ("vae tile 256 -> 128 px"), for the job's story.
	Change string
}

// Ladder is the degradation ladder: what the next attempt of a stage changes after a failure.
type Ladder struct {
	// VAETiles are the VAE tile sizes to step down through after an out-of-memory error.
	VAETiles []uint32
	// FirstResidentBlocks is the transformer's resident-block cap after its first
	// out-of-memory error; each later one halves it, down to 1.
	FirstResidentBlocks uint32
	// LaneCap is the lane's memory cap, which CapFactor lowers (0: no cap to lower).
	LaneCap uint64
	// CapFactor multiplies the cap at each lowering; CapSteps bounds the lowerings.
	CapFactor float64
	CapSteps  int
	// CPUFallback allows the last rung: CPU, for stages marked small.
	CPUFallback bool
}

// DefaultLadder is 256 → 128 → 64 px tiles, 30 resident blocks halving, two cap lowerings by
// 15 %, then CPU for small stages.
func DefaultLadder(laneCap uint64) Ladder {
	return Ladder{VAETiles: []uint32{256, 128, 64}, FirstResidentBlocks: 30, LaneCap: laneCap,
		CapFactor: 0.85, CapSteps: 2, CPUFallback: true}
}

// isVAE reports whether stage runs the VAE.
func isVAE(stage framepackv1.Stage) bool {
	return stage == framepackv1.Stage_STAGE_VAE_ENCODE || stage == framepackv1.Stage_STAGE_VAE_DECODE
}

// Next returns the next attempt's settings after attempt number attempt of st failed with
// class (v: the watchdog's verdict, for a hang), or false for a class that is never retried
// (bad input). Once every rung is used the next attempt runs as is; the retry budget ends it.
func (l Ladder) Next(st StageInfo, class Class, attempt int, cur Knobs, v *Verdict) (Step, bool) {
	next := cur
	switch class {
	case ClassOOM:
		if isVAE(st.Kind) {
			for _, px := range l.VAETiles {
				if cur.VAETilePx == 0 || px < cur.VAETilePx {
					next.VAETilePx = px
					from := "untiled"
					if cur.VAETilePx != 0 {
						from = fmt.Sprintf("%d px", cur.VAETilePx)
					}
					return Step{Knobs: next, Change: fmt.Sprintf("vae tile %s -> %d px", from, px)}, true
				}
			}
		}
		if st.Kind == framepackv1.Stage_STAGE_TRANSFORMER && cur.ResidentBlocks != 1 && cur.Backend != "cpu" {
			switch {
			case cur.ResidentBlocks == 0 && l.FirstResidentBlocks > 0:
				next.ResidentBlocks = l.FirstResidentBlocks
			case cur.ResidentBlocks > 1:
				next.ResidentBlocks = cur.ResidentBlocks / 2
			}
			if next.ResidentBlocks != cur.ResidentBlocks {
				return Step{Knobs: next, Change: fmt.Sprintf("resident transformer blocks %s -> %d", blocksName(cur.ResidentBlocks), next.ResidentBlocks)}, true
			}
		}
		if s, ok := l.lowerCap(cur); ok {
			return s, true
		}
		if s, ok := l.toCPU(st, cur, "out of memory with the smallest footprint"); ok {
			return s, true
		}
		// Nothing smaller to try: a fresh process may still fit (the memory another process
		// held is back, no fragmentation); the budget bounds these.
		return Step{Knobs: next, Change: "retry as is (no smaller footprint left to try)"}, true
	case ClassHang:
		if key, tier, ok := v.Conv(); ok && tier != LastConvTier {
			return Step{Knobs: next, MarkHung: &ConvMark{Key: key, Tier: tier},
				Change: fmt.Sprintf("conv tier %s marked hung for shape %q; the next worker skips it", tier, key)}, true
		}
		if attempt >= 2 {
			if s, ok := l.toCPU(st, cur, "hung again"); ok {
				return s, true
			}
		}
		return Step{Knobs: next, Change: "retry as is (the hang was not in a convolution)"}, true
	case ClassCrash, ClassDeviceLost:
		if attempt >= 2 {
			if s, ok := l.toCPU(st, cur, class.String()+" again"); ok {
				return s, true
			}
		}
		return Step{Knobs: next, Change: "retry as is after the device probe"}, true
	}
	return Step{}, false
}

// ranWith returns cur with ResidentBlocks set to the residency a transformer attempt reported
// (resident and streamed blocks from its LoadResponse; both zero: not reported), so the
// resident-block rung halves what actually ran rather than a fixed first value: a worker
// that planned 12 blocks resident under its cap retries with 6, not with 30. An attempt that
// already streamed every block has no resident rung left (1 ends it; the cap lowering comes
// next).
func ranWith(st StageInfo, cur Knobs, resident, streamed uint32) Knobs {
	if st.Kind != framepackv1.Stage_STAGE_TRANSFORMER || resident+streamed == 0 {
		return cur
	}
	switch {
	case resident == 0:
		cur.ResidentBlocks = 1
	case cur.ResidentBlocks == 0 || resident < cur.ResidentBlocks:
		cur.ResidentBlocks = resident
	}
	return cur
}

func blocksName(n uint32) string {
	if n == 0 {
		return "all"
	}
	return fmt.Sprint(n)
}

// lowerCap returns the step that lowers the memory cap, if the ladder has one left.
func (l Ladder) lowerCap(cur Knobs) (Step, bool) {
	if l.LaneCap == 0 || l.CapFactor <= 0 || l.CapFactor >= 1 || cur.Backend == "cpu" {
		return Step{}, false
	}
	capNow := cur.MemoryCap
	if capNow == 0 {
		capNow = l.LaneCap
	}
	floor := float64(l.LaneCap)
	for range l.CapSteps {
		floor *= l.CapFactor
	}
	lower := uint64(float64(capNow) * l.CapFactor)
	if float64(lower) < floor*0.999 {
		return Step{}, false
	}
	next := cur
	next.MemoryCap = lower
	return Step{Knobs: next, Change: fmt.Sprintf("memory cap %d -> %d bytes", capNow, lower)}, true
}

// toCPU returns the CPU rung for a small stage not yet on the CPU.
func (l Ladder) toCPU(st StageInfo, cur Knobs, why string) (Step, bool) {
	if !l.CPUFallback || !st.Small || cur.Backend == "cpu" || st.LaneBackend == "cpu" {
		return Step{}, false
	}
	next := cur
	next.Backend = "cpu"
	next.ConvFirstTier = workerkit.ConvTierUnspecified
	return Step{Knobs: next, Change: "backend -> cpu (" + why + "; the stage is small)"}, true
}
