package watchdog

import (
	"fmt"
	"strings"

	"github.com/framepackd/framepackd/internal/workerkit"
)

// LastConvTier is the conv chain's last tier (runtime.TierCPU's name). A hang there is never
// marked in the decision cache: with it skipped no tier would be left to serve the shape, so
// the stage is retried as for any other hang.
const LastConvTier = "cpu"

// ConvMark is "shape Key hung at tier Tier", recorded in the conv decision cache.
type ConvMark struct {
	Key, Tier string
}

// Step is one rung of the ladder: the settings of the next attempt and what changed.
type Step struct {
	Knobs workerkit.Override
	// MarkHung, when set, is recorded in the decision cache before the next attempt.
	MarkHung *ConvMark
	// Change says what the next attempt changes ("vae tile 256 -> 128 px"), for the job's story.
	Change string
}

// Ladder is the degradation ladder: what the next attempt of a stage changes after a failure.
type Ladder struct {
	// VAETiles are the VAE tile sizes to step down through after an out-of-memory error.
	VAETiles []uint32
	// FewerResidentBlocks allows the resident-block rung for a stage whose model has a stack of
	// blocks (ModelTraits.BlockStack): after an out-of-memory error the next attempt keeps half
	// the blocks the failed one had resident (ranWith), down to 1; an attempt that reported no
	// residency (its Load failed) keeps half the stack.
	FewerResidentBlocks bool
	// LaneCap is the memory cap CapFactor lowers when a stage names none (StageInfo.MemoryCap);
	// 0: no cap to lower.
	LaneCap uint64
	// CapFactor multiplies the cap at each lowering; CapSteps bounds the lowerings.
	CapFactor float64
	CapSteps  int
	// NarrowerDType allows the dtype rung for a model that declares narrower activation dtypes
	// (ModelTraits.FallbackDTypes): the next attempt runs in the widest of them.
	NarrowerDType bool
	// ConvTierDown allows the conv rungs: every convolution starts one tier further down the
	// chain (vendor tuned → vendor default → own kernel → cpu), whose workspaces are smaller.
	ConvTierDown bool
	// CPUFallback allows the last rung: CPU, for stages marked small.
	CPUFallback bool
}

// DefaultLadder is, after an out-of-memory error: for a model with a stack of blocks (the
// transformer's blocks, the text encoder's Llama layers), its resident blocks halved down to 1
// (the rest stream from host memory; fewer resident blocks before a lower cap); then two cap
// lowerings by 15 % (room for what the driver and vendor libraries allocate outside the
// runtime's allocator), then tiles 256 → 128 → 64 px (a model that tiles), then a narrower
// activation dtype (a model that declares one), then the conv tiers one by one (a model that
// convolves), then CPU for small stages. What a model has comes from its worker
// (StageInfo.Traits), never from the stage's name.
func DefaultLadder(laneCap uint64) Ladder {
	return Ladder{VAETiles: []uint32{256, 128, 64}, FewerResidentBlocks: true, LaneCap: laneCap,
		CapFactor: 0.85, CapSteps: 2, NarrowerDType: true, ConvTierDown: true, CPUFallback: true}
}

// Next returns the next attempt's settings after attempt number attempt of st failed with
// class (v: the watchdog's verdict, for a hang), or false for a class that is never retried
// (bad input). Once every rung is used the next attempt runs as is; the retry budget ends it.
func (l Ladder) Next(st StageInfo, class Class, attempt int, cur workerkit.Override, v *Verdict) (Step, bool) {
	next := cur
	switch class {
	case ClassOOM:
		// resident blocks (a model with a stack) → cap → smaller tiles → narrower dtype → conv
		// tier down → cpu (small stages)
		if s, ok := l.fewerResidentBlocks(st, cur); ok {
			return s, true
		}
		if s, ok := l.lowerCap(st, cur); ok {
			return s, true
		}
		if st.Traits.Tiles {
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
		if s, ok := l.narrowerDType(st, cur); ok {
			return s, true
		}
		if s, ok := l.convTierDown(st, cur); ok {
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
		return Step{Knobs: next, Change: "retry as is (" + hangWhere(v) + ")"}, true
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

// ranWith returns cur with MaxResidentBlocks set to the residency an attempt of a model with
// a stack of blocks reported (resident and streamed blocks from its LoadResponse; both zero:
// not reported), so the resident-block rung halves what actually ran rather than a fixed first
// value: a transformer that planned 12 blocks resident under its cap retries with 6, not with
// 30. An attempt that already streamed every block has no resident rung left (1 ends it; the
// cap lowering comes next).
func ranWith(st StageInfo, cur workerkit.Override, resident, streamed uint32) workerkit.Override {
	if st.Traits.BlockStack == "" || resident+streamed == 0 {
		return cur
	}
	switch {
	case resident == 0:
		cur.MaxResidentBlocks = 1
	case cur.MaxResidentBlocks == 0 || resident < cur.MaxResidentBlocks:
		cur.MaxResidentBlocks = resident
	}
	return cur
}

func blocksName(n uint32) string {
	if n == 0 {
		return "all"
	}
	return fmt.Sprint(n)
}

// fewerResidentBlocks returns the step that halves the resident blocks of a model with a stack
// of them (the first one, with no residency reported, keeps half the stack), down to 1.
func (l Ladder) fewerResidentBlocks(st StageInfo, cur workerkit.Override) (Step, bool) {
	stack, blocks := st.Traits.BlockStack, st.Traits.Blocks
	if stack == "" || !l.FewerResidentBlocks || cur.MaxResidentBlocks == 1 || cur.Backend == "cpu" {
		return Step{}, false
	}
	next := cur
	switch {
	case cur.MaxResidentBlocks == 0:
		next.MaxResidentBlocks = max(blocks/2, 1)
	case cur.MaxResidentBlocks > 1:
		next.MaxResidentBlocks = cur.MaxResidentBlocks / 2
	}
	if next.MaxResidentBlocks == cur.MaxResidentBlocks {
		return Step{}, false
	}
	return Step{Knobs: next, Change: fmt.Sprintf("resident %s %s -> %d", stack, blocksName(cur.MaxResidentBlocks), next.MaxResidentBlocks)}, true
}

// narrowerDType returns the step that runs the model's activations in the widest of the
// narrower dtypes it declared, if the ladder allows it and the attempt has not yet.
func (l Ladder) narrowerDType(st StageInfo, cur workerkit.Override) (Step, bool) {
	fb := st.Traits.FallbackDTypes
	if !l.NarrowerDType || len(fb) == 0 || cur.ActivationDType != "" || cur.Backend == "cpu" || st.LaneBackend == "cpu" {
		return Step{}, false
	}
	next := cur
	next.ActivationDType = fb[0]
	return Step{Knobs: next, Change: "activations -> " + fb[0]}, true
}

// convTierDown returns the step that starts every convolution one tier further down, if the
// ladder allows it, the model convolves and a GPU tier is left above the cpu tier.
func (l Ladder) convTierDown(st StageInfo, cur workerkit.Override) (Step, bool) {
	if !l.ConvTierDown || !st.Traits.Convolves || cur.Backend == "cpu" || st.LaneBackend == "cpu" || cur.ConvFirstTier >= workerkit.ConvTierCPU {
		return Step{}, false
	}
	from := cur.ConvFirstTier
	if from == workerkit.ConvTierUnspecified {
		from = workerkit.ConvTierVendorTuned
	}
	next := cur
	next.ConvFirstTier = from + 1
	return Step{Knobs: next, Change: fmt.Sprintf("convolutions from tier %d -> %d", from, next.ConvFirstTier)}, true
}

// lowerCap returns the step that lowers the memory cap, if the ladder has one left.
func (l Ladder) lowerCap(st StageInfo, cur workerkit.Override) (Step, bool) {
	base := st.MemoryCap
	if base == 0 {
		base = l.LaneCap
	}
	if base == 0 || l.CapFactor <= 0 || l.CapFactor >= 1 || cur.Backend == "cpu" {
		return Step{}, false
	}
	capNow := cur.MemoryCap
	if capNow == 0 {
		capNow = base
	}
	floor := float64(base)
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
func (l Ladder) toCPU(st StageInfo, cur workerkit.Override, why string) (Step, bool) {
	if !l.CPUFallback || !st.Small || cur.Backend == "cpu" || st.LaneBackend == "cpu" {
		return Step{}, false
	}
	next := cur
	next.Backend = "cpu"
	next.ConvFirstTier = workerkit.ConvTierUnspecified
	next.ActivationDType = "" // the cpu's own default
	return Step{Knobs: next, Change: "backend -> cpu (" + why + "; the stage is small)"}, true
}

// hangWhere says where a hang that no tier change can avoid happened, in the words a user
// reads in the job's story.
func hangWhere(v *Verdict) string {
	if key, tier, ok := v.Conv(); ok {
		return fmt.Sprintf("the hang was in convolution %q at tier %s, the last tier, which is never skipped", key, tier)
	}
	if v != nil && strings.Contains(v.Beacon.Op, "conv") {
		return fmt.Sprintf("the hang was in op %s, with no convolution tier recorded to skip", v.Beacon.Op)
	}
	if v != nil && v.Beacon.Op != "" {
		return fmt.Sprintf("the hang was in op %s, not in a convolution", v.Beacon.Op)
	}
	return "the hang was not in a convolution"
}
