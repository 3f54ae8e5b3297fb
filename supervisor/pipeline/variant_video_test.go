package pipeline

import (
	"slices"
	"strings"
	"testing"
)

// framesOf lists the values of a [1, 1, T, 1, 1] latent's frames.
func framesOf(v vol) []float32 { return slices.Clone(v.Data) }

// TestVideoVariant walks Studio's "Video" (backward) extension of a 6-latent video over three
// sections of window 2 with num_cleaned_frames 5, against video_prepare_clean_latents_and_indices
// worked out by hand. Section 0 (padding 2, next to nothing generated): 4 frames before (the
// video's last 4), zeros after, the 2x/4x context history[-6:-4]. Section 2 (padding 0, the start
// of the generated part): 1 frame before (the video's last), the newest generated frame after,
// 2x/4x context from history[-6:-1] (the video's frames before its last).
func TestVideoVariant(t *testing.T) {
	video := fill(6, 100) // frames 100..105
	v := variants[VariantVideo].(videoVariant).withVideo(video, 5)
	hist, gen, err := v.InitialHistory(fill(1, 0), nil)
	if err != nil || gen != 0 || !slices.Equal(framesOf(hist), framesOf(video)) {
		t.Fatalf("initial history %v %d %v, want the video", framesOf(hist), gen, err)
	}
	s0 := Section{Index: 0, Total: 3, Window: 2}
	c, err := v.Context(s0, vol{}, hist)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Indices.Clean, []int64{0, 1, 2, 3, 10, 11, 12, 13}) || !slices.Equal(c.Indices.Latent, []int64{8, 9}) ||
		!slices.Equal(c.Indices.Clean2x, []int64{14}) || !slices.Equal(c.Indices.Clean4x, []int64{15}) {
		t.Errorf("section 0 indices %+v", c.Indices)
	}
	if want := []float32{102, 103, 104, 105, 0, 0, 0, 0}; !slices.Equal(framesOf(c.Clean), want) {
		t.Errorf("section 0 clean latents %v, want %v", framesOf(c.Clean), want)
	}
	if !slices.Equal(framesOf(c.Clean4x), []float32{100}) || !slices.Equal(framesOf(c.Clean2x), []float32{101}) {
		t.Errorf("section 0 4x %v 2x %v, want [100] [101]", framesOf(c.Clean4x), framesOf(c.Clean2x))
	}
	// Two sections generated in front: 200, 201 then 300, 301 (the newest first).
	hist, _, _ = v.Append(s0, vol{}, hist, fill(2, 200))
	hist, _, _ = v.Append(Section{Index: 1, Total: 3, Window: 2}, vol{}, hist, fill(2, 300))
	s2 := Section{Index: 2, Total: 3, Window: 2}
	c, err = v.Context(s2, vol{}, hist)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Indices.Clean, []int64{0, 3}) || !slices.Equal(c.Indices.Latent, []int64{1, 2}) ||
		!slices.Equal(c.Indices.Clean2x, []int64{4, 5}) || !slices.Equal(c.Indices.Clean4x, []int64{6, 7, 8}) {
		t.Errorf("section 2 indices %+v", c.Indices)
	}
	// history: 300 301 200 201 100..105 (10 frames); [-6:-1] = 100..104: 4x the first 3, 2x the next 2.
	if !slices.Equal(framesOf(c.Clean), []float32{105, 300}) || !slices.Equal(framesOf(c.Clean4x), []float32{100, 101, 102}) ||
		!slices.Equal(framesOf(c.Clean2x), []float32{103, 104}) {
		t.Errorf("section 2 clean %v 4x %v 2x %v", framesOf(c.Clean), framesOf(c.Clean4x), framesOf(c.Clean2x))
	}
	// The decode after the first takes the newest 2·window frames of the generated ones.
	if got := framesOf(v.DecodeRange(s2, hist, 4, false)); !slices.Equal(got, []float32{300, 301, 200, 201}) {
		t.Errorf("decode range %v", got)
	}
	if v.TimeIndex(s0) != 2 || v.Name() != VariantVideo {
		t.Errorf("time index %d, name %s", v.TimeIndex(s0), v.Name())
	}
	if _, _, err := v.InitialHistory(fill(1, 0), &vol{}); err == nil {
		t.Error("an end frame was taken")
	}
}

// TestVideoF1Variant checks Studio's "Video F1" context on a 6-latent video, window 2,
// num_cleaned_frames 5 (video_f1_prepare_clean_latents_and_indices by hand): effective
// min(4, 6-2) = 4, 2x min(2, max(1, 6-4-1)) = 1, 4x min(16, max(1, 6-4-1)) = 1; indices
// [start 0 | 4x 1 | 2x 2 | 1x 3..6 | window 7, 8]; the context the history's last 6 frames; then
// a video too short for the window is refused.
func TestVideoF1Variant(t *testing.T) {
	video := fill(6, 100)
	v := variants[VariantVideoF1].(videoVariant).withVideo(video, 5)
	hist, _, _ := v.InitialHistory(vol{}, nil)
	c, err := v.Context(Section{Index: 0, Total: 2, Window: 2}, vol{}, hist)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.Indices.Clean, []int64{0, 3, 4, 5, 6}) || !slices.Equal(c.Indices.Clean4x, []int64{1}) ||
		!slices.Equal(c.Indices.Clean2x, []int64{2}) || !slices.Equal(c.Indices.Latent, []int64{7, 8}) {
		t.Errorf("indices %+v", c.Indices)
	}
	if !slices.Equal(framesOf(c.Clean), []float32{105, 102, 103, 104, 105}) || !slices.Equal(framesOf(c.Clean4x), []float32{100}) ||
		!slices.Equal(framesOf(c.Clean2x), []float32{101}) {
		t.Errorf("clean %v 4x %v 2x %v", framesOf(c.Clean), framesOf(c.Clean4x), framesOf(c.Clean2x))
	}
	hist, _, _ = v.Append(Section{}, vol{}, hist, fill(2, 200))
	if got := framesOf(v.DecodeRange(Section{Index: 1, Total: 2, Window: 2}, hist, 2, true)); !slices.Equal(got, []float32{200, 201}) {
		t.Errorf("first decode %v", got)
	}
	short := variants[VariantVideoF1].(videoVariant).withVideo(fill(2, 100), 5)
	h2, _, _ := short.InitialHistory(vol{}, nil)
	if _, err := short.Context(Section{Index: 0, Total: 1, Window: 2}, vol{}, h2); err == nil || !strings.Contains(err.Error(), "needs at least 3") {
		t.Errorf("a 2-latent video: %v", err)
	}
}
