package watchdog

import (
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestConvolves: the conv rungs are for the stages whose workers run convolutions.
func TestConvolves(t *testing.T) {
	want := map[framepackv1.Stage]bool{framepackv1.Stage_STAGE_VAE_ENCODE: true, framepackv1.Stage_STAGE_VAE_DECODE: true,
		framepackv1.Stage_STAGE_IMAGE_ENCODE: true, framepackv1.Stage_STAGE_TRANSFORMER: true}
	for v := range framepackv1.Stage_name {
		kind := framepackv1.Stage(v)
		if got := (StageInfo{Kind: kind}).Convolves(); got != want[kind] {
			t.Errorf("%v convolves %v, want %v", kind, got, want[kind])
		}
	}
}

// TestStreams: the stages whose worker streams a stack of blocks are the transformer (its
// blocks) and the text encoder (Llama's layers); no other stage gets the resident-block rung.
func TestStreams(t *testing.T) {
	want := map[framepackv1.Stage]string{framepackv1.Stage_STAGE_TRANSFORMER: "transformer blocks",
		framepackv1.Stage_STAGE_TEXT_ENCODE: "llama layers"}
	for v := range framepackv1.Stage_name {
		kind := framepackv1.Stage(v)
		stack, ok := StageInfo{Kind: kind}.Streams()
		name, streams := want[kind]
		if ok != streams || stack.Blocks != name || ok && stack.FirstResident == 0 {
			t.Errorf("%v streams %v %+v, want %v %q", kind, ok, stack, streams, name)
		}
	}
}

// TestResidentBlockRung: after an out-of-memory error a stage whose worker streams blocks keeps
// half the blocks the failed attempt actually had resident (as its LoadResponse reported them),
// down to 1, before the cap is lowered; the text encoder's Llama layers the same as the
// transformer's blocks. Each attempt's worker here honours max_resident_blocks: it keeps
// min(the cap it was given, what fits its memory cap) of its blocks resident.
func TestResidentBlockRung(t *testing.T) {
	te := StageInfo{Kind: framepackv1.Stage_STAGE_TEXT_ENCODE, LaneBackend: "cuda", MemoryCap: 10 << 30, Small: true}
	tr := StageInfo{Kind: framepackv1.Stage_STAGE_TRANSFORMER, LaneBackend: "cuda", MemoryCap: 10 << 30}
	vae := StageInfo{Kind: framepackv1.Stage_STAGE_VAE_DECODE, LaneBackend: "cuda", MemoryCap: 10 << 30}
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
			var k Knobs
			var changes []string
			for attempt := 1; ; attempt++ {
				if attempt > 20 {
					t.Fatalf("the ladder never ends: %q", changes)
				}
				var resident, streamed uint32
				if attempt > tc.loadFails {
					resident = tc.fit
					if k.ResidentBlocks != 0 {
						resident = min(resident, k.ResidentBlocks)
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
			if _, streams := tc.st.Streams(); streams && !tc.noRung && k.ResidentBlocks != 1 {
				t.Errorf("ladder ends with %d resident blocks, want 1", k.ResidentBlocks)
			}
			capNow := float64(tc.st.MemoryCap)
			if floor := uint64(float64(uint64(capNow*0.85)) * 0.85); k.MemoryCap != floor {
				t.Errorf("ladder ends with cap %d, want %d", k.MemoryCap, floor)
			}
			t.Logf("%q", changes)
		})
	}
}
