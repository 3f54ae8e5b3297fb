package api

import (
	"slices"
	"testing"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// Invalid UTF-8 cannot travel in a proto3 string through Go's gRPC (marshalling refuses it on
// both ends), so these checks are reached only by other clients; they are tested here.
func TestValidateUTF8(t *testing.T) {
	ok := func([]byte) (int, int, error) { return 1, 1, nil }
	for _, tc := range []struct {
		spec  *framepackv1.JobSpec
		field string
	}{
		{&framepackv1.JobSpec{Prompt: "a\xffb", TotalSecondLength: 1}, "spec.prompt"},
		{&framepackv1.JobSpec{Prompt: "p", NegativePrompt: "\xc3", TotalSecondLength: 1}, "spec.negative_prompt"},
		{&framepackv1.JobSpec{Prompt: "p", ImageFilename: "\xc3.png", TotalSecondLength: 1}, "spec.image_filename"},
	} {
		v := validateSubmit(&framepackv1.SubmitJobRequest{Image: []byte{1}, Spec: tc.spec}, nil, ok)
		var fields []string
		for _, fv := range v {
			fields = append(fields, fv.GetField())
		}
		if !slices.Equal(fields, []string{tc.field}) {
			t.Errorf("%v: violations %v, want %s", tc.spec, fields, tc.field)
		}
	}
	var v Violations
	checkReason(&v, "\xff")
	if len(v) != 1 || v[0].GetField() != "reason" {
		t.Errorf("reason: %v", v)
	}
}
