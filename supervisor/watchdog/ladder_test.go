package watchdog

import (
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// The traits the four workers declare in their LoadResponse (workerkit.ModelTraits): the ladder
// knows the models only through them.
var (
	textencTraits     = workerkit.ModelTraits{BlockStack: "llama layers", Blocks: 30}
	transformerTraits = workerkit.ModelTraits{BlockStack: "transformer blocks", Blocks: 60, Convolves: true}
	vaeTraits         = workerkit.ModelTraits{Convolves: true, Tiles: true}
	siglipTraits      = workerkit.ModelTraits{Convolves: true}
)

// TestTraitsChooseRungs: which rungs an out-of-memory error climbs comes from what the model
// declared, whatever the stage: a stack of blocks gets the resident rung (half the stack
// first), tiles the tile rungs, fallback dtypes one dtype rung, convolutions the conv rungs; a
// model that declared nothing (its Load never succeeded on the lane) only the cap rungs and the
// cpu for a small stage.
func TestTraitsChooseRungs(t *testing.T) {
	for _, tc := range []struct {
		name   string
		traits workerkit.ModelTraits
		want   []string
	}{
		{"nothing declared", workerkit.ModelTraits{}, []string{"memory cap", "memory cap", "backend -> cpu"}},
		{"a stack", workerkit.ModelTraits{BlockStack: "layers", Blocks: 8}, []string{"resident layers all -> 4", "resident layers 4 -> 2",
			"resident layers 2 -> 1", "memory cap", "memory cap", "backend -> cpu"}},
		{"tiles", workerkit.ModelTraits{Tiles: true}, []string{"memory cap", "memory cap", "vae tile untiled -> 256 px",
			"vae tile 256 px -> 128 px", "vae tile 128 px -> 64 px", "backend -> cpu"}},
		{"a fallback dtype", workerkit.ModelTraits{FallbackDTypes: []string{"bf16", "fp16"}}, []string{"memory cap", "memory cap",
			"activations -> bf16", "backend -> cpu"}},
		{"convolutions", siglipTraits, []string{"memory cap", "memory cap", "convolutions from tier 1 -> 2",
			"convolutions from tier 2 -> 3", "convolutions from tier 3 -> 4", "backend -> cpu"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// the stage's kind says nothing: the text encoder's stage with the traits of the case
			st := StageInfo{Kind: framepackv1.Stage_STAGE_TEXT_ENCODE, LaneBackend: "cuda", MemoryCap: 10 << 30, Small: true, Traits: tc.traits}
			l := DefaultLadder(0)
			var k workerkit.Override
			var changes []string
			for attempt := 1; attempt < 20; attempt++ {
				s, ok := l.Next(st, ClassOOM, attempt, k, nil)
				if !ok || strings.HasPrefix(s.Change, "retry as is") {
					break
				}
				changes = append(changes, s.Change)
				k = s.Knobs
			}
			checkRungs(t, tc.name, changes, tc.want)
			if k.Backend != "cpu" || k.ActivationDType != "" || k.ConvFirstTier != workerkit.ConvTierUnspecified {
				t.Errorf("the cpu rung keeps %+v; want the cpu's own dtype and convolutions", k)
			}
		})
	}
}

// TestResidentBlockRung: after an out-of-memory error a stage whose worker streams blocks keeps
// half the blocks the failed attempt actually had resident (as its LoadResponse reported them),
// down to 1, before the cap is lowered; the text encoder's Llama layers the same as the
// transformer's blocks. Each attempt's worker here honours max_resident_blocks: it keeps
// min(the cap it was given, what fits its memory cap) of its blocks resident.
func TestResidentBlockRung(t *testing.T) {
	te := StageInfo{Kind: framepackv1.Stage_STAGE_TEXT_ENCODE, LaneBackend: "cuda", MemoryCap: 10 << 30, Small: true, Traits: textencTraits}
	tr := StageInfo{Kind: framepackv1.Stage_STAGE_TRANSFORMER, LaneBackend: "cuda", MemoryCap: 10 << 30, Traits: transformerTraits}
	vae := StageInfo{Kind: framepackv1.Stage_STAGE_VAE_DECODE, LaneBackend: "cuda", MemoryCap: 10 << 30, Traits: vaeTraits}
	convThenCPU := []string{"convolutions from tier 1 -> 2", "convolutions from tier 2 -> 3", "convolutions from tier 3 -> 4",
		"backend -> cpu"}
	toCPU := convThenCPU[3:] // the text encoder runs no convolutions: no conv rungs
	for _, tc := range []struct {
		name string
		st   StageInfo
		// blocks is the worker's stack; fit how many of them its memory cap lets it keep
		// resident; loadFails how many first attempts fail in Load (no residency reported).
		blocks, fit uint32
		loadFails   int
		noRung      bool // the ladder without the resident-block rung
		want        []string
	}{
		{name: "text encoder all resident", st: te, blocks: 30, fit: 30,
			want: append([]string{"resident llama layers 30 -> 15", "resident llama layers 15 -> 7", "resident llama layers 7 -> 3",
				"resident llama layers 3 -> 1", "memory cap", "memory cap"}, toCPU...)},
		{name: "text encoder planned 5 of 30 under its cap", st: te, blocks: 30, fit: 5,
			want: append([]string{"resident llama layers 5 -> 2", "resident llama layers 2 -> 1", "memory cap", "memory cap"}, toCPU...)},
		{name: "text encoder load failed", st: te, blocks: 30, fit: 30, loadFails: 1,
			want: append([]string{"resident llama layers all -> 15", "resident llama layers 15 -> 7", "resident llama layers 7 -> 3",
				"resident llama layers 3 -> 1", "memory cap", "memory cap"}, toCPU...)},
		{name: "text encoder loads failed twice", st: te, blocks: 30, fit: 30, loadFails: 2,
			want: append([]string{"resident llama layers all -> 15", "resident llama layers 15 -> 7", "resident llama layers 7 -> 3",
				"resident llama layers 3 -> 1", "memory cap", "memory cap"}, toCPU...)},
		{name: "text encoder streamed every layer", st: te, blocks: 30, fit: 0,
			want: append([]string{"memory cap", "memory cap"}, toCPU...)},
		{name: "text encoder of one resident layer", st: te, blocks: 2, fit: 1,
			want: append([]string{"memory cap", "memory cap"}, toCPU...)},
		{name: "text encoder without the rung", st: te, blocks: 30, fit: 30, noRung: true,
			want: append([]string{"memory cap", "memory cap"}, toCPU...)},
		{name: "transformer planned 12 of 60", st: tr, blocks: 60, fit: 12,
			want: []string{"resident transformer blocks 12 -> 6", "resident transformer blocks 6 -> 3", "resident transformer blocks 3 -> 1",
				"memory cap", "memory cap", convThenCPU[0], convThenCPU[1], convThenCPU[2]}},
		{name: "transformer load failed", st: tr, blocks: 60, fit: 60, loadFails: 1,
			want: []string{"resident transformer blocks all -> 30", "resident transformer blocks 30 -> 15",
				"resident transformer blocks 15 -> 7", "resident transformer blocks 7 -> 3", "resident transformer blocks 3 -> 1",
				"memory cap", "memory cap", convThenCPU[0], convThenCPU[1], convThenCPU[2]}},
		// A residency reported for a stage that streams nothing is not a stack to shrink.
		{name: "vae", st: vae, blocks: 8, fit: 4,
			want: []string{"memory cap", "memory cap", "vae tile untiled -> 256 px", "vae tile 256 px -> 128 px",
				"vae tile 128 px -> 64 px", convThenCPU[0], convThenCPU[1], convThenCPU[2]}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := DefaultLadder(0)
			l.FewerResidentBlocks = !tc.noRung
			var k workerkit.Override
			var changes []string
			for attempt := 1; ; attempt++ {
				if attempt > 20 {
					t.Fatalf("the ladder never ends: %q", changes)
				}
				var resident, streamed uint32
				if attempt > tc.loadFails {
					resident = tc.fit
					if k.MaxResidentBlocks != 0 {
						resident = min(resident, k.MaxResidentBlocks)
					}
					streamed = tc.blocks - resident
				}
				k = ranWith(tc.st, k, resident, streamed)
				s, ok := l.Next(tc.st, ClassOOM, attempt, k, nil)
				if !ok {
					t.Fatalf("attempt %d: an out-of-memory error not retried", attempt)
				}
				if s.Change == "retry as is (no smaller footprint left to try)" {
					break
				}
				changes = append(changes, s.Change)
				k = s.Knobs
			}
			checkRungs(t, tc.st.Name(), changes, tc.want)
			if tc.st.Traits.BlockStack != "" && !tc.noRung && k.MaxResidentBlocks != 1 {
				t.Errorf("ladder ends with %d resident blocks, want 1", k.MaxResidentBlocks)
			}
			capNow := float64(tc.st.MemoryCap)
			if floor := uint64(float64(uint64(capNow*0.85)) * 0.85); k.MemoryCap != floor {
				t.Errorf("ladder ends with cap %d, want %d", k.MemoryCap, floor)
			}
			t.Logf("%q", changes)
		})
	}
}
