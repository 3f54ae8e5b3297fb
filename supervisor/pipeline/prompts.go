package pipeline

import (
	"fmt"

	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// TimeIndex: i2v generates sections backwards in time, so the first generated is the last in
// the video.
func (i2v) TimeIndex(s Section) int { return s.Total - 1 - s.Index }

// TimeIndex: f1 generates sections forwards in time.
func (f1) TimeIndex(s Section) int { return s.Index }

// jobPrompts is a job's prompt as the sections use it: the distinct texts, encoded once each
// (text 0 as the text encoder's prompt, the others as its extra prompts), and the text of each
// section.
type jobPrompts struct {
	texts   []string
	section []int // section (generation order) → index in texts
}

// newJobPrompts reads spec.prompt (plain, or FramePack-Studio's timed syntax) and gives each
// section the prompt active at the section's start time in the video.
func newJobPrompts(spec *framepackv1.JobSpec, v Variant, total, window int) (*jobPrompts, error) {
	ps, err := plan.ParsePrompts(spec.GetPrompt())
	if err != nil {
		return nil, fmt.Errorf("%w: prompt: %w", errBadInput, err)
	}
	texts, index := plan.DistinctPrompts(ps)
	jp := &jobPrompts{texts: texts}
	for i := range total {
		k := v.TimeIndex(Section{Index: i, Total: total, Window: window})
		jp.section = append(jp.section, index[plan.PromptAt(ps, plan.SectionStart(k, window))])
	}
	return jp, nil
}

// jobPrompts reads the job's prompt for its variant (a resumed job's variant is the
// checkpoint's).
func (j *jobRun) jobPrompts() (*jobPrompts, error) {
	return newJobPrompts(j.job.Spec, j.variant, j.total, j.window)
}

// promptTensor names text k's tensor base in the conditioning (text 0 keeps the plain names).
func promptTensor(base string, k int) string {
	if k == 0 {
		return base
	}
	return fmt.Sprintf("%s.%d", base, k)
}
