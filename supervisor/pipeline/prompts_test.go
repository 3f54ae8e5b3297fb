package pipeline

import (
	"errors"
	"slices"
	"testing"

	"github.com/framepackd/framepackd/internal/parity"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
)

// TestJobPrompts gives each section the prompt active at its start time in the video: i2v
// generates backwards in time, so its first section takes the last prompt; f1 forwards.
func TestJobPrompts(t *testing.T) {
	spec := &framepackv1.JobSpec{Prompt: "[0s: a cat sits] [1s: the cat jumps] [3s: the cat lands]"}
	// 4 sections of window 9: 1.2 s each, starting at 0, 1.2, 2.4 and 3.6 s.
	for _, tc := range []struct {
		v    Variant
		want []int
	}{{i2v{}, []int{2, 1, 1, 0}}, {f1{}, []int{0, 1, 1, 2}}} {
		jp, err := newJobPrompts(spec, tc.v, 4, 9)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(jp.texts, []string{"a cat sits", "the cat jumps", "the cat lands"}) || !slices.Equal(jp.section, tc.want) {
			t.Errorf("%s: texts %q sections %v, want sections %v", tc.v.Name(), jp.texts, jp.section, tc.want)
		}
	}
	// A text used twice is encoded once.
	jp, err := newJobPrompts(&framepackv1.JobSpec{Prompt: "[0s: sit] [1.2s: jump] [2.4s: sit]"}, f1{}, 3, 9)
	if err != nil || !slices.Equal(jp.texts, []string{"sit", "jump"}) || !slices.Equal(jp.section, []int{0, 1, 0}) {
		t.Errorf("repeated text: %+v %v", jp, err)
	}
	// A plain prompt is every section's, unchanged.
	jp, err = newJobPrompts(&framepackv1.JobSpec{Prompt: " a cat "}, i2v{}, 2, 9)
	if err != nil || !slices.Equal(jp.texts, []string{" a cat "}) || !slices.Equal(jp.section, []int{0, 0}) {
		t.Errorf("plain prompt: %+v %v", jp, err)
	}
	if _, err := newJobPrompts(&framepackv1.JobSpec{Prompt: "[0s a cat]"}, i2v{}, 2, 9); !errors.Is(err, errBadInput) {
		t.Errorf("malformed prompt: %v, want bad input", err)
	}
	if promptTensor(tLlamaVec, 0) != "llama_vec" || promptTensor(tLlamaVec, 2) != "llama_vec.2" {
		t.Errorf("tensor names %s %s", promptTensor(tLlamaVec, 0), promptTensor(tLlamaVec, 2))
	}
}

// TestJobPromptsStudioReference checks the section → prompt mapping against the
// pipeline_studio reference fixture (testdata/reference): for every case, the distinct texts
// in order and the text each section (generation order) sampled with.
func TestJobPromptsStudioReference(t *testing.T) {
	fx := parity.LoadReference(t, "pipeline_studio")
	for _, c := range fx.Cases {
		var prompt string
		var texts []string
		var sections []int
		var window int
		c.InputValue(t, "prompt", &prompt)
		if !c.Param(t, "prompt_texts", &texts) || !c.Param(t, "section_prompts", &sections) || !c.Param(t, "latent_window_size", &window) {
			t.Fatalf("case %s: no prompt_texts, section_prompts or latent_window_size", c.Name)
		}
		jp, err := newJobPrompts(&framepackv1.JobSpec{Prompt: prompt}, i2v{}, len(sections), window)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(jp.texts, texts) || !slices.Equal(jp.section, sections) {
			t.Errorf("case %s: texts %q sections %v, the reference %q %v", c.Name, jp.texts, jp.section, texts, sections)
		}
	}
}
