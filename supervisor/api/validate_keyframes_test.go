package api

import (
	"bytes"
	"image"
	"image/png"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestValidateKeyframes checks JobSpec.keyframes at submit with the real image decoder: each bad
// keyframe is one violation on its field saying what is wrong.
func TestValidateKeyframes(t *testing.T) {
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewNRGBA(image.Rect(0, 0, 8, 6))); err != nil {
		t.Fatal(err)
	}
	img := buf.Bytes()
	at := func(s uint32, b []byte) *framepackv1.Keyframe {
		return &framepackv1.Keyframe{At: &framepackv1.Keyframe_Section{Section: s}, Image: b}
	}
	for _, tc := range []struct {
		name    string
		edit    func(s *framepackv1.JobSpec)
		field   string
		message string
	}{
		{"two keyframes", func(s *framepackv1.JobSpec) { s.Keyframes = []*framepackv1.Keyframe{at(0, img), at(3, img)} }, "", ""},
		{"by time", func(s *framepackv1.JobSpec) {
			s.Keyframes = []*framepackv1.Keyframe{{At: &framepackv1.Keyframe_Seconds{Seconds: 0.5}, Image: img}}
		}, "", ""},
		{"no image", func(s *framepackv1.JobSpec) { s.Keyframes = []*framepackv1.Keyframe{at(1, nil)} }, "spec.keyframes[0].image", "required"},
		{"not an image", func(s *framepackv1.JobSpec) { s.Keyframes = []*framepackv1.Keyframe{at(1, []byte("nope"))} }, "spec.keyframes[0].image", "not a usable image"},
		{"hash only", func(s *framepackv1.JobSpec) {
			s.Keyframes = []*framepackv1.Keyframe{{At: &framepackv1.Keyframe_Section{Section: 1}, ImageSha256: "ab"}}
		}, "spec.keyframes[0].image_sha256", "set by the server"},
		{"past the end", func(s *framepackv1.JobSpec) { s.Keyframes = []*framepackv1.Keyframe{at(4, img)} }, "spec.keyframes", "sections 0 to 3"},
		{"same section", func(s *framepackv1.JobSpec) {
			s.Keyframes = []*framepackv1.Keyframe{at(1, img), {At: &framepackv1.Keyframe_Seconds{Seconds: 0.2}, Image: img}}
		}, "spec.keyframes", "has keyframes[0] already"},
		{"f1", func(s *framepackv1.JobSpec) { s.Variant, s.Keyframes = "f1", []*framepackv1.Keyframe{at(1, img)} }, "spec.keyframes", "f1 variant takes no keyframes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// 1.07 s at window 2: four sections.
			spec := &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1.07, LatentWindowSize: 2}
			tc.edit(spec)
			v := validateSubmit(&framepackv1.SubmitJobRequest{Image: img, Spec: spec}, nil, DecodeImage)
			wantViolation(t, v, tc.field, tc.message)
		})
	}
}
