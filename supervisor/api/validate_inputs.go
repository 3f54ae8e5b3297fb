package api

import (
	"fmt"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// extendsVideo reports whether a spec asks to extend a video.
func extendsVideo(s *framepackv1.JobSpec) bool {
	return len(s.GetInputVideo()) > 0 || s.GetInputVideoJobId() != ""
}

// requestBytes is the size of a request's images and video together.
func requestBytes(req *framepackv1.SubmitJobRequest) int {
	n := len(req.GetImage()) + len(req.GetSpec().GetEndImage()) + len(req.GetSpec().GetInputVideo())
	for _, k := range req.GetSpec().GetKeyframes() {
		n += len(k.GetImage())
	}
	return n
}

// checkKeyframes checks JobSpec.keyframes: at most plan.MaxKeyframes, each an image the pipeline
// can decode for a section of the job (by index or time, no section twice), an i2v job that
// starts from an image (FramePack-eichi's keyframes belong to its i2v loop; its F1 takes only the
// first image).
func checkKeyframes(v *Violations, s *framepackv1.JobSpec, decode func([]byte) (int, int, error)) {
	ks := s.GetKeyframes()
	if len(ks) == 0 {
		return
	}
	if len(ks) > plan.MaxKeyframes {
		v.Add("spec.keyframes", "%d keyframes, the limit is %d", len(ks), plan.MaxKeyframes)
		return
	}
	if vr := s.GetVariant(); vr != "" && vr != "i2v" {
		v.Add("spec.keyframes", "the %s variant takes no keyframes (FramePack-eichi's keyframes belong to the i2v loop): drop them or use variant i2v", vr)
	}
	if extendsVideo(s) {
		v.Add("spec.keyframes", "a job that extends a video takes no keyframes")
	}
	for i, k := range ks {
		field := fmt.Sprintf("spec.keyframes[%d]", i)
		switch img := k.GetImage(); {
		case len(img) == 0 && k.GetImageSha256() != "":
			v.Add(field+".image_sha256", "is set by the server; send the image itself in image (a spec read back from a job holds only its hash)")
		case len(img) == 0:
			v.Add(field+".image", "required: the section's image as PNG, JPEG or WebP bytes")
		case len(img) > MaxImageBytes:
			v.Add(field+".image", "%d bytes, the limit is %d (64 MiB)", len(img), MaxImageBytes)
		default:
			if _, _, err := decode(img); err != nil {
				v.Add(field+".image", "not a usable image (PNG, JPEG or WebP): %v", err)
			}
		}
	}
	if _, err := plan.KeyframeSections(s); err != nil {
		v.Add("spec.keyframes", "%v", err)
	}
}
