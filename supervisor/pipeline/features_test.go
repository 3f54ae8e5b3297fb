package pipeline_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// TestPipelineLorasAndTimedPrompt runs the pipeline fixture's first case through a daemon with
// two LoRAs stacked and a timed prompt of two texts: the transformer stages' events and the
// stored job list the LoRAs with the weights each changed, the video differs from the
// reference without them, the text encoder ran once for both texts and the conditioning holds
// each text's outputs.
func TestPipelineLorasAndTimedPrompt(t *testing.T) {
	jc := firstCase(t)
	root, err := parity.Root()
	if err != nil {
		t.Fatal(err)
	}
	loras := filepath.Join(root, "models", "loras")
	jc.spec = proto.Clone(jc.spec).(*framepackv1.JobSpec)
	jc.spec.Loras = []*framepackv1.Lora{{Path: filepath.Join(loras, "style_peft.safetensors"), Strength: 0.5},
		{Path: filepath.Join(loras, "subject_original.safetensors")}}
	// Window 3: a section is 0.4 s; i2v samples the second half of the video first.
	jc.spec.Prompt = "[0s: " + jc.spec.GetPrompt() + "] [0.4s: the girl sits down and waves]"
	workers := buildWorkers(t)
	opts := newOpts(t, workers)
	d, err := newDaemon(opts, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	job, evs := runJob(t, jc, opts.Socket)
	want := []*framepackv1.LoraApplied{
		{Path: jc.spec.Loras[0].Path, Strength: 0.5, Format: "peft", WeightsChanged: 34},
		{Path: jc.spec.Loras[1].Path, Strength: 1, Format: "original", WeightsChanged: 32},
	}
	same := func(got []*framepackv1.LoraApplied) bool {
		return slices.EqualFunc(got, want, func(a, b *framepackv1.LoraApplied) bool { return proto.Equal(a, b) })
	}
	if !same(job.GetLorasApplied()) {
		t.Errorf("stored loras_applied %v, want %v", job.GetLorasApplied(), want)
	}
	if job.GetSpec().GetLoras()[1].GetStrength() != 1 {
		t.Errorf("stored spec loras %v: strength 0 means 1", job.GetSpec().GetLoras())
	}
	transformers, texts := 0, 0
	for _, ev := range evs {
		f := ev.GetStageFinished()
		switch f.GetStage() {
		case framepackv1.Stage_STAGE_TRANSFORMER:
			transformers++
			if !same(f.GetLoras()) {
				t.Errorf("transformer stage finished with loras %v, want %v", f.GetLoras(), want)
			}
		case framepackv1.Stage_STAGE_TEXT_ENCODE:
			texts++
			if len(f.GetLoras()) != 0 {
				t.Errorf("text encode lists loras %v", f.GetLoras())
			}
		}
	}
	total := int(job.GetProgress().GetTotalSections())
	if transformers != total || texts != 1 {
		t.Errorf("%d transformer and %d text encode stages, want %d and 1", transformers, texts, total)
	}
	jf := openJobFiles(t, opts.State, job.GetId(), total)
	v0, _ := read(t, jf.cond, "llama_vec")
	v1, _ := read(t, jf.cond, "llama_vec.1")
	if len(v0) != len(v1) || slices.Equal(v0, v1) {
		t.Errorf("conditioning llama_vec and llama_vec.1: %d and %d values, equal %v; want two texts' outputs", len(v0), len(v1), slices.Equal(v0, v1))
	}
	logIntermediate(t, jc.c, "llama_vec", v0, []int64{1, int64(len(v0)) / int64(jc.c.Intermediate(t, "llama_vec").Shape[2]), jc.c.Intermediate(t, "llama_vec").Shape[2]})
	checkSettings(t, job, want)
	px, _ := read(t, jf.sections[total-1], "history_pixels")
	ref := jc.c.Output(t, "pixels")
	if e := parity.RelL2(px, ref.F32); e <= jc.c.Tolerance.RelL2 {
		t.Errorf("pixels within %.3g of the reference without loras and with one prompt: the loras or the prompt changed nothing", e)
	}
}

// checkSettings checks the final video's settings: the JSON file beside it and, when ffprobe
// is installed, the MP4's comment tag hold the same prompts, seed, variant and LoRAs.
func checkSettings(t *testing.T, job *framepackv1.Job, loras []*framepackv1.LoraApplied) {
	t.Helper()
	mp4 := job.GetResult().GetVideoPath()
	raw, err := os.ReadFile(strings.TrimSuffix(mp4, filepath.Ext(mp4)) + ".json")
	if err != nil {
		t.Fatalf("settings beside the video: %v", err)
	}
	var s pipeline.Settings
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatal(err)
	}
	spec := job.GetSpec()
	if s.Job != job.GetId() || s.Prompt != spec.GetPrompt() || len(s.Prompts) != 2 || s.Prompts[1].Start != 0.4 || s.Seed != spec.GetSeed() ||
		s.Variant != pipeline.VariantI2V || s.Steps != spec.GetSteps() || s.Models["transformer"] == "" || len(s.Loras) != len(loras) {
		t.Fatalf("settings %s", raw)
	}
	for i, l := range loras {
		if s.Loras[i].Path != l.GetPath() || s.Loras[i].Strength != float64(l.GetStrength()) || s.Loras[i].WeightsChanged != l.GetWeightsChanged() {
			t.Errorf("settings lora %d %+v, want %v", i, s.Loras[i], l)
		}
	}
	if _, err := exec.LookPath("ffprobe"); err != nil || filepath.Ext(mp4) != ".mp4" {
		t.Logf("no ffprobe or no mp4 (%s): the MP4 tag is not checked", mp4)
		return
	}
	out, err := exec.Command("ffprobe", "-v", "error", "-show_entries", "format_tags=comment", "-of", "default=nw=1:nk=1", mp4).Output()
	if err != nil {
		t.Fatalf("ffprobe: %v", err)
	}
	if strings.TrimSpace(string(out)) != strings.TrimSpace(string(raw)) {
		t.Errorf("mp4 comment %q, want the settings %q", out, raw)
	}
}
