package watchdog

import (
	"fmt"
	"strings"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// Knobs are the settings of one stage attempt that the degradation ladder turns. Zero values
// mean the lane's and the model's defaults.
type Knobs struct {
	// VAETilePx is the VAE's spatial tile size in pixels (0: untiled, the model's default).
	VAETilePx uint32
	// ResidentBlocks caps the blocks of a stage's block stack (StageInfo.Streams: transformer
	// blocks, Llama layers) kept on the device, the rest streaming from host memory (0: as many
	// as fit the cap).
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
	// FewerResidentBlocks allows the resident-block rung for a stage whose worker streams a
	// stack of blocks (StageInfo.Streams): after an out-of-memory error the next attempt keeps
	// half the blocks the failed one had resident (ranWith), down to 1; an attempt that reported
	// no residency (its Load failed) goes to the stack's FirstResident.
	FewerResidentBlocks bool
	// LaneCap is the memory cap CapFactor lowers when a stage names none (StageInfo.MemoryCap);
	// 0: no cap to lower.
	LaneCap uint64
	// CapFactor multiplies the cap at each lowering; CapSteps bounds the lowerings.
	CapFactor float64
	CapSteps  int
	// ConvTierDown allows the conv rungs: every convolution starts one tier further down the
	// chain (vendor tuned → vendor default → own kernel → cpu), whose workspaces are smaller.
	ConvTierDown bool
	// CPUFallback allows the last rung: CPU, for stages marked small.
	CPUFallback bool
}

// DefaultLadder is, after an out-of-memory error: for a stage whose worker streams blocks (the
// transformer's blocks, the text encoder's Llama layers), its resident blocks halved down to 1
// (the rest stream from host memory; fewer resident blocks before a lower cap); then two cap
// lowerings by 15 % (room for what the driver and vendor libraries allocate outside the
// runtime's allocator), then VAE tiles 256 → 128 → 64 px, then the conv tiers one by one (for
// a stage that convolves), then CPU for small stages.
func DefaultLadder(laneCap uint64) Ladder {
	return Ladder{VAETiles: []uint32{256, 128, 64}, FewerResidentBlocks: true, LaneCap: laneCap,
		CapFactor: 0.85, CapSteps: 2, ConvTierDown: true, CPUFallback: true}
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
		// resident blocks (a stage that streams them) → cap → smaller tiles → conv tier down →
		// cpu (small stages)
		if s, ok := l.fewerResidentBlocks(st, cur); ok {
			return s, true
		}
		if s, ok := l.lowerCap(st, cur); ok {
			return s, true
		}
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

// BlockStack is the stack of repeated blocks a stage's worker keeps on the device up to
// LoadRequest.max_resident_blocks, streaming the rest from host memory one block ahead, and
// reports in its LoadResponse (resident_blocks, streamed_blocks).
type BlockStack struct {
	// Blocks names the blocks in the job's story ("transformer blocks", "llama layers").
	Blocks string
	// FirstResident is the resident cap after an out-of-memory error of an attempt that
	// reported no residency (its Load failed): half the blocks FramePack's model runs.
	FirstResident uint32
}

// Streams returns the stack of blocks the stage's worker streams, or false for a stage whose
// worker keeps its whole model on the device. It is the one place that says which stages
// those are; the resident-block rung (ranWith, fewerResidentBlocks) asks it.
func (s StageInfo) Streams() (BlockStack, bool) {
	switch s.Kind {
	case framepackv1.Stage_STAGE_TRANSFORMER: // HunyuanVideo's 20 double and 40 single blocks
		return BlockStack{Blocks: "transformer blocks", FirstResident: 30}, true
	case framepackv1.Stage_STAGE_TEXT_ENCODE: // Llama's layers up to hidden_states[-3]: 30 of 32
		return BlockStack{Blocks: "llama layers", FirstResident: 15}, true
	}
	return BlockStack{}, false
}

// ranWith returns cur with ResidentBlocks set to the residency an attempt of a stage that
// streams blocks reported (resident and streamed blocks from its LoadResponse; both zero: not
// reported), so the resident-block rung halves what actually ran rather than a fixed first
// value: a transformer that planned 12 blocks resident under its cap retries with 6, not with
// 30. An attempt that already streamed every block has no resident rung left (1 ends it; the
// cap lowering comes next).
func ranWith(st StageInfo, cur Knobs, resident, streamed uint32) Knobs {
	if _, ok := st.Streams(); !ok || resident+streamed == 0 {
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

// fewerResidentBlocks returns the step that halves the resident blocks of a stage that streams
// them (the first one, with no residency reported, goes to the stack's FirstResident), down
// to 1.
func (l Ladder) fewerResidentBlocks(st StageInfo, cur Knobs) (Step, bool) {
	stack, ok := st.Streams()
	if !ok || !l.FewerResidentBlocks || cur.ResidentBlocks == 1 || cur.Backend == "cpu" {
		return Step{}, false
	}
	next := cur
	switch {
	case cur.ResidentBlocks == 0:
		next.ResidentBlocks = stack.FirstResident
	case cur.ResidentBlocks > 1:
		next.ResidentBlocks = cur.ResidentBlocks / 2
	}
	if next.ResidentBlocks == cur.ResidentBlocks {
		return Step{}, false
	}
	return Step{Knobs: next, Change: fmt.Sprintf("resident %s %s -> %d", stack.Blocks, blocksName(cur.ResidentBlocks), next.ResidentBlocks)}, true
}

// Convolves reports whether the stage's worker runs convolutions through the conv chain: the
// VAE, SigLIP's patch embedding, the transformer's patch embedders. The text encoders run none,
// so the conv rungs would only cost them retries.
func (s StageInfo) Convolves() bool {
	switch s.Kind {
	case framepackv1.Stage_STAGE_VAE_ENCODE, framepackv1.Stage_STAGE_VAE_DECODE, framepackv1.Stage_STAGE_IMAGE_ENCODE,
		framepackv1.Stage_STAGE_TRANSFORMER:
		return true
	}
	return false
}

// convTierDown returns the step that starts every convolution one tier further down, if the
// ladder allows it, the stage convolves and a GPU tier is left above the cpu tier.
func (l Ladder) convTierDown(st StageInfo, cur Knobs) (Step, bool) {
	if !l.ConvTierDown || !st.Convolves() || cur.Backend == "cpu" || st.LaneBackend == "cpu" || cur.ConvFirstTier >= workerkit.ConvTierCPU {
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
func (l Ladder) lowerCap(st StageInfo, cur Knobs) (Step, bool) {
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
func (l Ladder) toCPU(st StageInfo, cur Knobs, why string) (Step, bool) {
	if !l.CPUFallback || !st.Small || cur.Backend == "cpu" || st.LaneBackend == "cpu" {
		return Step{}, false
	}
	next := cur
	next.Backend = "cpu"
	next.ConvFirstTier = workerkit.ConvTierUnspecified
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
