package api

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/internal/safetensors"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Limits of a SubmitJobRequest beyond the ranges written in the proto.
const (
	// MaxImageBytes is the largest input image (job_service.proto: at most 64 MiB).
	MaxImageBytes = 64 << 20
	// MaxImagePixels is the largest input image in pixels unless the daemon says otherwise
	// (plan's limits table), checked from the header before decoding.
	MaxImagePixels = plan.DefaultMaxImagePixels
	// MaxPromptBytes is the longest prompt or negative prompt, in bytes of UTF-8.
	MaxPromptBytes = 64 << 10
	// MaxFilenameBytes is the longest image_filename.
	MaxFilenameBytes = 255
	// MaxReasonBytes is the longest cancellation reason.
	MaxReasonBytes = 1 << 10
	// MaxClientRequestIDBytes is the longest client_request_id.
	MaxClientRequestIDBytes = 128
	// MaxRequestBytes bounds the images (start, end, keyframes) and the input video of one
	// request together.
	MaxRequestBytes = 512 << 20
	// MaxRecvMsgBytes is the largest request the server accepts: MaxRequestBytes of images and
	// video and room for the rest of the spec.
	MaxRecvMsgBytes = MaxRequestBytes + 1<<20
)

// Violations collects the field violations of one request.
type Violations []*errdetails.BadRequest_FieldViolation

// Add records that field is wrong and why.
func (v *Violations) Add(field, format string, args ...any) {
	*v = append(*v, &errdetails.BadRequest_FieldViolation{Field: field, Description: fmt.Sprintf(format, args...)})
}

// Err returns nil when there are no violations, else an INVALID_ARGUMENT status whose message
// names every field and whose details hold a BadRequest with one violation per field.
func (v Violations) Err(what string) error {
	if len(v) == 0 {
		return nil
	}
	parts := make([]string, len(v))
	for i, fv := range v {
		parts[i] = fv.GetField() + ": " + fv.GetDescription()
	}
	st := status.New(codes.InvalidArgument, fmt.Sprintf("invalid %s: %s", what, strings.Join(parts, "; ")))
	withDetails, err := st.WithDetails(&errdetails.BadRequest{FieldViolations: v})
	if err != nil {
		return st.Err()
	}
	return withDetails.Err()
}

// DecodeImage checks that data is an image the pipeline can read: PNG, JPEG or WebP within
// MaxImagePixels, fully decoded by internal/imageproc (the pipeline's own decoder).
func DecodeImage(data []byte) (width, height int, err error) {
	img, _, err := imageproc.Decode(data, imageproc.Options{MaxPixels: MaxImagePixels})
	if err != nil {
		return 0, 0, err
	}
	return img.Width, img.Height, nil
}

// validateClientRequestID checks SubmitJobRequest.client_request_id: empty (none), or at most
// MaxClientRequestIDBytes printable ASCII characters without spaces.
func validateClientRequestID(v *Violations, id string) {
	if len(id) > MaxClientRequestIDBytes {
		v.Add("client_request_id", "%d characters, at most %d printable ASCII characters (0x21 to 0x7e) are allowed", len(id), MaxClientRequestIDBytes)
		return
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			v.Add("client_request_id", "byte %d is %#02x: only printable ASCII characters (0x21 to 0x7e), at most %d, are allowed", i, id[i], MaxClientRequestIDBytes)
			return
		}
	}
}

func badFloat(f float32) bool {
	return math.IsNaN(float64(f)) || math.IsInf(float64(f), 0)
}

// validateSubmit checks every field of a SubmitJobRequest. lanes are the lanes a job may be
// pinned to; decode checks the image.
func validateSubmit(req *framepackv1.SubmitJobRequest, lanes []string, decode func([]byte) (int, int, error)) Violations {
	var v Violations
	switch img := req.GetImage(); {
	case len(img) == 0 && extendsVideo(req.GetSpec()):
		// A job that extends a video starts from the video's frames.
	case len(img) > 0 && extendsVideo(req.GetSpec()):
		v.Add("image", "a job that extends a video takes no image: its frames come from the video (send one or the other)")
	case len(img) == 0:
		v.Add("image", "required: the start frame as PNG, JPEG or WebP bytes")
	case len(img) > MaxImageBytes:
		v.Add("image", "%d bytes, the limit is %d (64 MiB)", len(img), MaxImageBytes)
	default:
		if _, _, err := decode(img); err != nil {
			v.Add("image", "not a usable image: %v", err)
		}
	}
	s := req.GetSpec()
	if s == nil {
		v.Add("spec", "required: the job's parameters")
		return v
	}
	if n := s.GetImageFilename(); n != "" {
		switch {
		case len(n) > MaxFilenameBytes:
			v.Add("spec.image_filename", "%d bytes, the limit is %d", len(n), MaxFilenameBytes)
		case !utf8.ValidString(n):
			v.Add("spec.image_filename", "not valid UTF-8")
		case strings.ContainsAny(n, `/\`) || n == "." || n == ".." || strings.ContainsFunc(n, unicode.IsControl):
			v.Add("spec.image_filename", "must be a plain file name (no path separators or control characters)")
		}
	}
	checkText(&v, "spec.prompt", s.GetPrompt(), true)
	if plan.IsTimed(s.GetPrompt()) { // [0s: a cat sits] [2.5s: the cat jumps]
		if _, err := plan.ParsePrompts(s.GetPrompt()); err != nil {
			v.Add("spec.prompt", "%v", err)
		}
	}
	checkText(&v, "spec.negative_prompt", s.GetNegativePrompt(), false)
	// spec.seed: every int64 is a valid seed (torch.Generator.manual_seed takes them all).
	switch secs := s.GetTotalSecondLength(); {
	case badFloat(secs):
		v.Add("spec.total_second_length", "must be a finite number of seconds")
	case secs == 0:
		v.Add("spec.total_second_length", "required: the video length in seconds, in (0, %d]", plan.MaxSecondLength)
	case secs < 0 || secs > plan.MaxSecondLength:
		v.Add("spec.total_second_length", "must be in (0, %d], got %g", plan.MaxSecondLength, secs)
	}
	// The window and the step count: 0 means the default (WithDefaults), else the table's range.
	if w := s.GetLatentWindowSize(); w != 0 && (w < plan.MinLatentWindowSize || w > plan.MaxLatentWindowSize) {
		v.Add("spec.latent_window_size", "must be %d to %d (0 means %d), got %d", plan.MinLatentWindowSize, plan.MaxLatentWindowSize, DefaultLatentWindowSize, w)
	}
	if n := s.GetSteps(); n != 0 && (n < plan.MinSteps || n > plan.MaxSteps) {
		v.Add("spec.steps", "must be %d to %d (0 means %d), got %d", plan.MinSteps, plan.MaxSteps, DefaultSteps, n)
	}
	checkScale(&v, "spec.cfg", s.GetCfg(), "0 means 1, no negative pass")
	checkScale(&v, "spec.gs", s.GetGs(), "0 means 10")
	switch rs := s.GetRs(); {
	case badFloat(rs):
		v.Add("spec.rs", "must be a finite number")
	case rs < 0 || rs > 1:
		v.Add("spec.rs", "must be 0 to 1, got %g", rs)
	}
	for _, fv := range plan.CheckCache(s) {
		v.Add(fv.Field, "%s", fv.Description)
	}
	// spec.resolution and spec.buckets: the pipeline's rules (supervisor/pipeline/plan).
	for _, fv := range plan.CheckBuckets(s) {
		v.Add(fv.Field, "%s", fv.Description)
	}
	if s.Mp4Crf != nil && s.GetMp4Crf() > plan.MaxMP4CRF {
		v.Add("spec.mp4_crf", "must be 0 to %d, got %d", plan.MaxMP4CRF, s.GetMp4Crf())
	}
	if s.GpuMemoryPreservationGb != nil {
		switch g := s.GetGpuMemoryPreservationGb(); {
		case badFloat(g):
			v.Add("spec.gpu_memory_preservation_gb", "must be a finite number")
		case g < 0 || g > plan.MaxGPUMemoryPreservationGB:
			v.Add("spec.gpu_memory_preservation_gb", "must be 0 to %d, got %g", plan.MaxGPUMemoryPreservationGB, g)
		}
	}
	if ka := s.GetKeepAlive(); ka != nil {
		if err := ka.CheckValid(); err != nil || ka.AsDuration() < 0 || ka.AsDuration() > plan.MaxKeepAlive {
			v.Add("spec.keep_alive", "must be 0 to %v, got %v", plan.MaxKeepAlive, ka.AsDuration())
		}
	}
	checkLoras(&v, s.GetLoras())
	checkWeights(&v, s)
	checkEndFrame(&v, s, decode)
	checkKeyframes(&v, s, decode)
	checkVideoSpec(&v, s)
	if n := requestBytes(req); n > MaxRequestBytes {
		v.Add("spec", "the images and video of the request hold %d bytes together, the limit is %d (512 MiB)", n, MaxRequestBytes)
	}
	if b := s.GetBatchId(); b != "" {
		checkBatchID(&v, "spec.batch_id", b)
	}
	if l := s.GetLane(); l != "" && !slices.Contains(lanes, l) {
		v.Add("spec.lane", "no lane %q on this server (lanes: %s)", l, strings.Join(lanes, ", "))
	}
	return v
}

// checkEndFrame checks JobSpec.end_image and end_strength: an image the pipeline can decode,
// a strength from 0 to 1 (FramePack-Studio's range) only with an image, and the i2v variant
// (FramePack-F1 has no end frame in the reference apps).
func checkEndFrame(v *Violations, s *framepackv1.JobSpec, decode func([]byte) (int, int, error)) {
	img := s.GetEndImage()
	switch {
	case len(img) == 0:
		if s.GetEndImageSha256() != "" {
			v.Add("spec.end_image_sha256", "is set by the server; send the end image itself in spec.end_image (a spec read back from a job holds only its hash)")
		}
	case len(img) > MaxImageBytes:
		v.Add("spec.end_image", "%d bytes, the limit is %d (64 MiB)", len(img), MaxImageBytes)
	default:
		if _, _, err := decode(img); err != nil {
			v.Add("spec.end_image", "not a usable image (PNG, JPEG or WebP): %v", err)
		}
		if vr := s.GetVariant(); vr != "" && vr != "i2v" {
			v.Add("spec.end_image", "the %s variant has no end frame (FramePack-Studio's end frame belongs to the i2v loop): drop the end image or use variant i2v", vr)
		}
	}
	if s.EndStrength != nil {
		switch st := s.GetEndStrength(); {
		case len(img) == 0:
			v.Add("spec.end_strength", "set without spec.end_image: give the end image too, or leave the strength unset")
		case badFloat(st) || st < 0 || st > 1:
			v.Add("spec.end_strength", "must be a number from 0 to 1 (unset means 1), got %g", st)
		}
	}
}

// MaxLoras bounds JobSpec.loras.
const MaxLoras = 16

// MaxLoraStrength bounds the magnitude of a LoRA's strength.
const MaxLoraStrength = 4

// checkLoras checks each LoRA names an absolute path to a readable safetensors file on the
// server and a finite strength; what the keys mean is the transformer worker's to check.
func checkLoras(v *Violations, ls []*framepackv1.Lora) {
	if len(ls) > MaxLoras {
		v.Add("spec.loras", "%d LoRAs, the limit is %d", len(ls), MaxLoras)
		return
	}
	for i, l := range ls {
		field := fmt.Sprintf("spec.loras[%d]", i)
		switch p := l.GetPath(); {
		case p == "":
			v.Add(field+".path", "required: a LoRA safetensors file on the server")
		case !filepath.IsAbs(p):
			v.Add(field+".path", "must be an absolute path on the server, got %q", p)
		default:
			f, err := safetensors.Open(p)
			if err != nil {
				v.Add(field+".path", "not a readable safetensors file: %v", err)
				break
			}
			f.Close()
		}
		if st := l.GetStrength(); badFloat(st) || st < -MaxLoraStrength || st > MaxLoraStrength {
			v.Add(field+".strength", "must be a finite number from %d to %d (0 means 1), got %g", -MaxLoraStrength, MaxLoraStrength, st)
		}
	}
}

// checkWeights checks JobSpec.weights, fp8_compute and transformer_checkpoint (an absolute path
// to a readable safetensors file; its layout is the transformer worker's to check).
func checkWeights(v *Violations, s *framepackv1.JobSpec) {
	if w := s.GetWeights(); w != "" && w != "fp8" {
		v.Add("spec.weights", "want empty (as the checkpoint stores them) or fp8, got %q", w)
	}
	switch m := s.GetFp8Compute(); m {
	case "", "weight_only", "tensor", "token":
	default:
		v.Add("spec.fp8_compute", "want weight_only, tensor or token, got %q", m)
	}
	switch p := s.GetTransformerCheckpoint(); {
	case p == "":
	case !filepath.IsAbs(p):
		v.Add("spec.transformer_checkpoint", "must be an absolute path on the server, got %q", p)
	default:
		f, err := safetensors.Open(p)
		if err != nil {
			v.Add("spec.transformer_checkpoint", "not a readable safetensors file: %v", err)
			break
		}
		f.Close()
	}
}

// checkVariant checks JobSpec.variant with the pipeline's check (nil: only i2v runs here).
func checkVariant(v *Violations, name string, check func(string) error) {
	if check == nil {
		if name != "" && name != "i2v" {
			v.Add("spec.variant", "this server runs only the i2v variant, not %q", name)
		}
		return
	}
	if err := check(name); err != nil {
		v.Add("spec.variant", "%v", err)
	}
}

func checkText(v *Violations, field, text string, required bool) {
	switch {
	case required && strings.TrimSpace(text) == "":
		v.Add(field, "required: describe the motion")
	case len(text) > MaxPromptBytes:
		v.Add(field, "%d bytes, the limit is %d", len(text), MaxPromptBytes)
	case !utf8.ValidString(text):
		v.Add(field, "not valid UTF-8")
	}
}

func checkScale(v *Violations, field string, x float32, zero string) {
	switch {
	case badFloat(x):
		v.Add(field, "must be a finite number")
	case x != 0 && (x < 1 || x > 32):
		v.Add(field, "must be 1 to 32 (%s), got %g", zero, x)
	}
}

func utf8Valid(s string) bool { return utf8.ValidString(s) }
