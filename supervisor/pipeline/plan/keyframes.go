package plan

import (
	"fmt"
	"math"
	"strconv"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// SectionAtOrAfter is the first section (in video time, window w) that starts at or after t
// seconds: where a keyframe given by time applies from. t is read as the shortest decimal that
// prints its float32 (as TotalSections reads the length), so 0.8 s is 3 sections of 0.267 s, not
// a hair more.
func SectionAtOrAfter(t float32, w int) int {
	if w == 0 {
		w = DefaultLatentWindowSize
	}
	sec, err := strconv.ParseFloat(strconv.FormatFloat(float64(t), 'g', -1, 32), 64)
	if err != nil || sec <= 0 {
		return 0
	}
	return int(math.Max(0, math.Ceil(sec/(float64(w*4)/30)-1e-9)))
}

// KeyframeSections returns the section (0-based in video time) of each of a spec's keyframes,
// in their order, checking that each names one, within the job's sections and no two the same;
// an error names the keyframe (keyframes[i]).
func KeyframeSections(spec *framepackv1.JobSpec) ([]int, error) {
	total := TotalSections(spec)
	var out []int
	seen := map[int]int{}
	for i, k := range spec.GetKeyframes() {
		var s int
		switch at := k.GetAt().(type) {
		case *framepackv1.Keyframe_Section:
			s = int(min(at.Section, math.MaxInt32))
		case *framepackv1.Keyframe_Seconds:
			if math.IsNaN(float64(at.Seconds)) || math.IsInf(float64(at.Seconds), 0) || at.Seconds < 0 {
				return nil, fmt.Errorf("keyframes[%d].seconds: %v is not a time in the video", i, at.Seconds)
			}
			s = SectionAtOrAfter(at.Seconds, int(spec.GetLatentWindowSize()))
		default:
			return nil, fmt.Errorf("keyframes[%d]: give its section or its seconds", i)
		}
		if s >= total {
			return nil, fmt.Errorf("keyframes[%d]: section %d, the video has sections 0 to %d (the last starts at %.3g s)",
				i, s, total-1, SectionStart(total-1, windowOf(spec)))
		}
		if j, dup := seen[s]; dup {
			return nil, fmt.Errorf("keyframes[%d]: section %d has keyframes[%d] already", i, s, j)
		}
		seen[s] = i
		out = append(out, s)
	}
	return out, nil
}

func windowOf(spec *framepackv1.JobSpec) int {
	if w := spec.GetLatentWindowSize(); w != 0 {
		return int(w)
	}
	return DefaultLatentWindowSize
}

// KeyframeAnchors returns, for each of total sections in video time, the index (into sections,
// the keyframes' sections) of the keyframe it samples with, -1 for the start image: the
// keyframe of the latest keyed section at or before it (FramePack-eichi's: in generation order,
// the keyframe of the smallest section index at or after the section's).
func KeyframeAnchors(sections []int, total int) []int {
	out := make([]int, total)
	for k := range out {
		out[k] = -1
		best := -1
		for i, s := range sections {
			if s <= k && s > best {
				best, out[k] = s, i
			}
		}
	}
	return out
}
