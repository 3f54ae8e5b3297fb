package plan

import (
	"slices"
	"strings"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

func TestKeyframeSections(t *testing.T) {
	at := func(s uint32) *framepackv1.Keyframe {
		return &framepackv1.Keyframe{At: &framepackv1.Keyframe_Section{Section: s}}
	}
	sec := func(t float32) *framepackv1.Keyframe {
		return &framepackv1.Keyframe{At: &framepackv1.Keyframe_Seconds{Seconds: t}}
	}
	for _, tc := range []struct {
		name      string
		seconds   float32
		window    uint32
		keyframes []*framepackv1.Keyframe
		want      []int
		err       string
	}{
		// 1.07 s of window 2: 4 sections of 8/30 s (0, 0.267, 0.533, 0.8).
		{"by section", 1.07, 2, []*framepackv1.Keyframe{at(3), at(1)}, []int{3, 1}, ""},
		{"by time", 1.07, 2, []*framepackv1.Keyframe{sec(0.3), sec(0), sec(0.8)}, []int{2, 0, 3}, ""},
		// 0.8 is exactly section 3's start read as a decimal (in float32 it is a hair more).
		{"a section's start", 1.07, 2, []*framepackv1.Keyframe{sec(0.8), sec(0.2667)}, []int{3, 2}, ""},
		{"past the end", 1.07, 2, []*framepackv1.Keyframe{at(4)}, nil, "keyframes[0]: section 4, the video has sections 0 to 3"},
		{"past the end by time", 1.07, 2, []*framepackv1.Keyframe{sec(0.81)}, nil, "keyframes[0]: section 4"},
		{"twice", 1.07, 2, []*framepackv1.Keyframe{at(2), sec(0.3)}, nil, "keyframes[1]: section 2 has keyframes[0] already"},
		{"neither", 1.07, 2, []*framepackv1.Keyframe{{}}, nil, "keyframes[0]: give its section or its seconds"},
		{"negative", 1.07, 2, []*framepackv1.Keyframe{sec(-1)}, nil, "keyframes[0].seconds"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := KeyframeSections(&framepackv1.JobSpec{TotalSecondLength: tc.seconds, LatentWindowSize: tc.window, Keyframes: tc.keyframes})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("sections %v %v, want %v", got, err, tc.want)
			}
		})
	}
}

// TestKeyframeAnchors checks eichi's rule: in generation order (i2v: the last section first), a
// section uses the keyframe of the smallest generation index at or after its own, which in video
// time is the latest keyed section at or before it.
func TestKeyframeAnchors(t *testing.T) {
	sections := []int{3, 1} // keyframes 0 and 1
	got := KeyframeAnchors(sections, 4)
	if want := []int{-1, 1, 1, 0}; !slices.Equal(got, want) {
		t.Fatalf("anchors %v, want %v", got, want)
	}
	// eichi, written out: section_latents keyed by generation index (total-1-k).
	total := 4
	keys := map[int]int{}
	for i, s := range sections {
		keys[total-1-s] = i
	}
	for gen := range total {
		best, use := -1, -1
		for g, i := range keys {
			if g >= gen && (best < 0 || g < best) {
				best, use = g, i
			}
		}
		if k := total - 1 - gen; got[k] != use {
			t.Errorf("generation %d (time %d): anchor %d, eichi's %d", gen, k, got[k], use)
		}
	}
}
