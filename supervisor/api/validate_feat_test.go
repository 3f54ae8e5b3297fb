package api

import (
	"bytes"
	"errors"
	"image"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/framepackd/framepackd/internal/safetensors"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"google.golang.org/protobuf/proto"
)

// TestValidateFeatures checks the submit-time rules of timed prompts, LoRAs, the variant and the
// transformer's weights (weights, fp8_compute, transformer_checkpoint):
// each bad value is one violation on its field that says what is wrong (a malformed timestamp
// with its position).
func TestValidateFeatures(t *testing.T) {
	ok := func([]byte) (int, int, error) { return 1, 1, nil }
	dir := t.TempDir()
	lora := filepath.Join(dir, "style.safetensors")
	if err := safetensors.WriteFile(lora, []safetensors.Tensor{safetensors.FromFloat32("transformer.proj_out.lora_A.weight", []int64{1, 2}, []float32{1, 2})}, safetensors.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	junk := filepath.Join(dir, "junk.safetensors")
	if err := os.WriteFile(junk, []byte("not a safetensors file"), 0o600); err != nil {
		t.Fatal(err)
	}
	noF1 := func(name string) error {
		if name == "f1" {
			return errors.New("variant f1 needs the FramePack-F1 transformer")
		}
		return nil
	}
	tests := []struct {
		name    string
		edit    func(s *framepackv1.JobSpec)
		check   func(string) error
		field   string
		message string
	}{
		{"timed prompt", func(s *framepackv1.JobSpec) { s.Prompt = "[0s: a cat sits] [2.5s: the cat jumps]" }, nil, "", ""},
		{"bad timestamp", func(s *framepackv1.JobSpec) { s.Prompt = "[0s: a cat sits] [2,5s: the cat jumps]" }, nil,
			"spec.prompt", "position 19"},
		{"text outside", func(s *framepackv1.JobSpec) { s.Prompt = "[0s: a cat sits] and jumps" }, nil, "spec.prompt", "position 18"},
		{"lora", func(s *framepackv1.JobSpec) { s.Loras = []*framepackv1.Lora{{Path: lora, Strength: 0.8}} }, nil, "", ""},
		{"lora relative", func(s *framepackv1.JobSpec) { s.Loras = []*framepackv1.Lora{{Path: "style.safetensors"}} }, nil,
			"spec.loras[0].path", "absolute"},
		{"lora missing", func(s *framepackv1.JobSpec) {
			s.Loras = []*framepackv1.Lora{{Path: filepath.Join(dir, "nope.safetensors")}}
		}, nil,
			"spec.loras[0].path", "no such file"},
		{"lora not safetensors", func(s *framepackv1.JobSpec) { s.Loras = []*framepackv1.Lora{{Path: lora}, {Path: junk}} }, nil,
			"spec.loras[1].path", "not a readable safetensors file"},
		{"lora strength", func(s *framepackv1.JobSpec) { s.Loras = []*framepackv1.Lora{{Path: lora, Strength: 5}} }, nil,
			"spec.loras[0].strength", "-4 to 4"},
		{"too many loras", func(s *framepackv1.JobSpec) {
			for range MaxLoras + 1 {
				s.Loras = append(s.Loras, &framepackv1.Lora{Path: lora})
			}
		}, nil, "spec.loras", "limit is 16"},
		{"f1 without the check", func(s *framepackv1.JobSpec) { s.Variant = "f1" }, nil, "spec.variant", "only the i2v variant"},
		{"f1 without its transformer", func(s *framepackv1.JobSpec) { s.Variant = "f1" }, noF1, "spec.variant", "FramePack-F1 transformer"},
		{"f1", func(s *framepackv1.JobSpec) { s.Variant = "f1" }, func(string) error { return nil }, "", ""},
		{"fp8 weights", func(s *framepackv1.JobSpec) {
			s.Weights, s.Fp8Compute, s.TransformerCheckpoint = "fp8", "token", lora // any readable safetensors file
		}, nil, "", ""},
		{"weights unknown", func(s *framepackv1.JobSpec) { s.Weights = "int8" }, nil, "spec.weights", "fp8"},
		{"fp8 compute unknown", func(s *framepackv1.JobSpec) { s.Fp8Compute = "block" }, nil, "spec.fp8_compute", "weight_only, tensor or token"},
		{"checkpoint relative", func(s *framepackv1.JobSpec) { s.TransformerCheckpoint = "fp8.safetensors" }, nil,
			"spec.transformer_checkpoint", "absolute"},
		{"checkpoint not safetensors", func(s *framepackv1.JobSpec) { s.TransformerCheckpoint = junk }, nil,
			"spec.transformer_checkpoint", "not a readable safetensors file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1}
			tc.edit(spec)
			v := validateSubmit(&framepackv1.SubmitJobRequest{Image: []byte{1}, Spec: spec}, nil, ok)
			checkVariant(&v, spec.GetVariant(), tc.check)
			wantViolation(t, v, tc.field, tc.message)
		})
	}
}

// wantViolation checks that v is one violation on field whose description contains message, or
// none when field is "".
func wantViolation(t *testing.T, v Violations, field, message string) {
	t.Helper()
	if field == "" {
		if len(v) != 0 {
			t.Fatalf("violations %v", v)
		}
		return
	}
	if len(v) != 1 || v[0].GetField() != field || !strings.Contains(v[0].GetDescription(), message) {
		t.Fatalf("violations %v, want one on %s saying %q", v, field, message)
	}
}

// TestValidateEndFrame checks JobSpec.end_image and end_strength at submit with the real image
// decoder: each bad value is one violation on its field that says what to do.
func TestValidateEndFrame(t *testing.T) {
	var buf bytes.Buffer
	if err := png.Encode(&buf, image.NewNRGBA(image.Rect(0, 0, 8, 6))); err != nil {
		t.Fatal(err)
	}
	img := buf.Bytes()
	tests := []struct {
		name    string
		edit    func(s *framepackv1.JobSpec)
		field   string
		message string
	}{
		{"end image", func(s *framepackv1.JobSpec) { s.EndImage = img }, "", ""},
		{"end image and strength", func(s *framepackv1.JobSpec) { s.EndImage, s.EndStrength = img, proto.Float32(0.5) }, "", ""},
		{"strength 0", func(s *framepackv1.JobSpec) { s.EndImage, s.EndStrength = img, proto.Float32(0) }, "", ""},
		{"undecodable", func(s *framepackv1.JobSpec) { s.EndImage = []byte("GIF89a not an image we read") }, "spec.end_image", "not a usable image"},
		{"truncated png", func(s *framepackv1.JobSpec) { s.EndImage = img[:len(img)/2] }, "spec.end_image", "not a usable image"},
		{"too large", func(s *framepackv1.JobSpec) { s.EndImage = make([]byte, MaxImageBytes+1) }, "spec.end_image", "limit is"},
		{"strength above 1", func(s *framepackv1.JobSpec) { s.EndImage, s.EndStrength = img, proto.Float32(1.5) }, "spec.end_strength", "0 to 1"},
		{"strength negative", func(s *framepackv1.JobSpec) { s.EndImage, s.EndStrength = img, proto.Float32(-0.1) }, "spec.end_strength", "0 to 1"},
		{"strength NaN", func(s *framepackv1.JobSpec) {
			s.EndImage, s.EndStrength = img, proto.Float32(float32(math.NaN()))
		}, "spec.end_strength", "0 to 1"},
		{"strength without image", func(s *framepackv1.JobSpec) { s.EndStrength = proto.Float32(0.5) }, "spec.end_strength", "without spec.end_image"},
		{"hash without image", func(s *framepackv1.JobSpec) { s.EndImageSha256 = "ab12" }, "spec.end_image_sha256", "send the end image"},
		{"f1", func(s *framepackv1.JobSpec) { s.EndImage, s.Variant = img, "f1" }, "spec.end_image", "f1 variant has no end frame"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			spec := &framepackv1.JobSpec{Prompt: "p", TotalSecondLength: 1}
			tc.edit(spec)
			v := validateSubmit(&framepackv1.SubmitJobRequest{Image: img, Spec: spec}, nil, DecodeImage)
			wantViolation(t, v, tc.field, tc.message)
		})
	}
}
