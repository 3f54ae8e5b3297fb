package pipeline_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/supervisor/pipeline"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// opStudio is the op of the pipeline_studio reference fixture's cases: FramePack's i2v loop
// with FramePack-Studio's end frame and per-section prompts (testdata/reference).
const opStudio = "pipeline.studio_i2v"

// loadStudioCase reads a pipeline_studio case as a job: the i2v case, plus the end image and
// its strength when the case has one.
func loadStudioCase(t *testing.T, c parity.Case) i2vCase {
	t.Helper()
	jc := loadCase(t, c)
	if !c.HasInput("end_image_hwc_u8") {
		return jc
	}
	var hw [2]int
	var strength float32
	if !c.Param(t, "end_image_hw", &hw) || !c.Param(t, "end_strength", &strength) {
		t.Fatalf("case %s: an end image without end_image_hw and end_strength", c.Name)
	}
	end := c.Input(t, "end_image_hwc_u8")
	if !parity.SameShape(end.Shape, []int64{int64(hw[0]), int64(hw[1]), 3}) {
		t.Fatalf("case %s: end image %v, params say %v", c.Name, end.Shape, hw)
	}
	jc.spec.EndImage = pngOf(t, end.Ints, hw[0], hw[1])
	jc.spec.EndStrength = proto.Float32(strength)
	return jc
}

// TestParityPipelineStudio runs every case of the pipeline_studio reference fixture (an end
// frame with a strength below 1, a timed prompt over three sections, both at once) as an i2v
// job through a daemon with real workers and checks it section by section against FramePack's
// loop with FramePack-Studio's changes: each section's generated latents, the final history,
// pixels and uint8 frames within the case's tolerance; the end frame's bucketed image, its
// latent and the settings beside the video.
func TestParityPipelineStudio(t *testing.T) {
	fx := parity.LoadReference(t, "pipeline_studio")
	workers := buildWorkers(t)
	ran := 0
	for _, c := range fx.Cases {
		if c.Op != opStudio {
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
			continue
		}
		ran++
		t.Run(c.Name, func(t *testing.T) {
			jc := loadStudioCase(t, c)
			end := jc.spec.GetEndImage()
			opts, job, evs := runParityJob(t, workers, jc)
			total := checkPaddings(t, jc, job)
			if len(job.GetSpec().GetEndImage()) != 0 {
				t.Errorf("the stored spec keeps the end image's %d bytes", len(job.GetSpec().GetEndImage()))
			}
			if len(end) > 0 {
				sum := sha256.Sum256(end)
				if got := job.GetSpec().GetEndImageSha256(); got != hex.EncodeToString(sum[:]) {
					t.Errorf("stored end_image_sha256 %q, want the image's", got)
				}
			}
			checkEvents(t, jc, evs, total)
			checkOutputsStudio(t, jc, opts.State, job.GetId(), total)
			checkSettingsStudio(t, jc, job.GetResult().GetVideoPath(), end)
		})
	}
	if ran == 0 {
		t.Fatalf("fixture %s has no %s case", fx.Name, opStudio)
	}
}

// TestStudioFixtureMatters is the negative control of TestParityPipelineStudio: a job that
// gets one feature wrong must miss the reference by far more than the case's tolerance, so
// the fixture does pin the feature down. The first end-frame case runs with end_strength 1
// instead of its own; the first timed case runs with its first prompt for every section.
func TestStudioFixtureMatters(t *testing.T) {
	fx := parity.LoadReference(t, "pipeline_studio")
	workers := buildWorkers(t)
	pick := func(ok func(parity.Case, i2vCase) bool) (parity.Case, i2vCase) {
		for _, c := range fx.Cases {
			if c.Op != opStudio {
				continue
			}
			if jc := loadStudioCase(t, c); ok(c, jc) {
				return c, jc
			}
		}
		t.Fatal("no such case")
		return parity.Case{}, i2vCase{}
	}
	for _, tc := range []struct {
		name  string
		pick  func(parity.Case, i2vCase) bool
		wrong func(t *testing.T, c parity.Case, jc i2vCase)
	}{
		{"end strength", func(_ parity.Case, jc i2vCase) bool {
			return len(jc.spec.GetEndImage()) > 0 && jc.spec.GetEndStrength() != 1
		}, func(_ *testing.T, _ parity.Case, jc i2vCase) { jc.spec.EndStrength = proto.Float32(1) }},
		{"section prompts", func(_ parity.Case, jc i2vCase) bool {
			return len(jc.spec.GetEndImage()) == 0 && plan.IsTimed(jc.spec.GetPrompt())
		}, func(t *testing.T, c parity.Case, jc i2vCase) {
			var texts []string
			c.Param(t, "prompt_texts", &texts)
			jc.spec.Prompt = texts[0]
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, jc := pick(tc.pick)
			tc.wrong(t, c, jc)
			opts, job, _ := runParityJob(t, workers, jc)
			jf := openJobFiles(t, opts.State, job.GetId(), int(job.GetProgress().GetTotalSections()))
			lat, shape := read(t, jf.sections[0], "history_latents")
			v, _ := framesT(lat, shape, 0, jc.window)
			e := parity.RelL2(v, c.Intermediate(t, "section0_latents").F32)
			t.Logf("case %s with the %s wrong: section0_latents rel_l2=%.3g (tolerance %.3g)", c.Name, tc.name, e, c.Tolerance.RelL2)
			if e < 5*c.Tolerance.RelL2 {
				t.Errorf("case %s: a wrong %s moves section 0 by only %.3g: the fixture does not test it", c.Name, tc.name, e)
			}
		})
	}
}

// checkOutputsStudio compares a finished job's files with a pipeline_studio case.
func checkOutputsStudio(t *testing.T, jc i2vCase, state, id string, total int) {
	t.Helper()
	c := jc.c
	jf := openJobFiles(t, state, id, total)
	for name, tensor := range map[string]string{"clip_pooler": "clip_pooler", "start_latent": "start_latent", "image_hidden": "image_embeddings"} {
		v, shape := read(t, jf.cond, tensor)
		logIntermediate(t, c, name, v, shape)
	}
	for name, want := range map[string]string{"image_np": "image_np", "end_np": "end_np"} {
		if c.Intermediates[want] == nil {
			if _, ok := jf.cond.Info(name); ok {
				t.Errorf("case %s: the conditioning has %s, the case no end frame", c.Name, name)
			}
			continue
		}
		got, shape := read(t, jf.cond, name)
		ref := c.Intermediate(t, want)
		if !parity.SameShape(shape, ref.Shape) {
			t.Fatalf("case %s %s: shape %v, want %v", c.Name, name, shape, ref.Shape)
		}
		if d, n := parity.MaxAbsDiff(got, ref.F32); d > 1 {
			t.Errorf("case %s %s: max diff %v (%d values differ), want at most 1", c.Name, name, d, n)
		}
	}
	if c.Intermediates["end_latent"] != nil {
		v, shape := read(t, jf.cond, "end_latent")
		c.Check(t, "end_latent", v, shape, c.Intermediate(t, "end_latent"))
		st, err := strconv.ParseFloat(jf.cond.Metadata()["end_strength"], 64)
		if err != nil || float32(st) != jc.spec.GetEndStrength() {
			t.Errorf("conditioning end_strength %q, want %g", jf.cond.Metadata()["end_strength"], jc.spec.GetEndStrength())
		}
	}
	w := jc.window
	for i, f := range jf.sections {
		lat, shape := read(t, f, "history_latents")
		off := 0
		if i == total-1 {
			off = 1 // the last section's latents follow the start latent
		}
		v, s := framesT(lat, shape, off, off+w)
		c.Check(t, fmt.Sprintf("section%d_latents", i), v, s, c.Intermediate(t, fmt.Sprintf("section%d_latents", i)))
	}
	final := jf.sections[total-1]
	lat, shape, gen := readHistory(t, final)
	v, s := framesT(lat, shape, 0, gen)
	c.Check(t, "history_latents", v, s, c.Output(t, "history_latents"))
	checkPixels(t, c, final)
}

// checkSettingsStudio checks the settings beside the final video: the timed prompt's entries
// and the end frame (hash, stored image, strength).
func checkSettingsStudio(t *testing.T, jc i2vCase, mp4 string, end []byte) {
	t.Helper()
	raw, err := os.ReadFile(strings.TrimSuffix(mp4, filepath.Ext(mp4)) + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var st pipeline.Settings
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	var texts []string
	jc.c.Param(t, "prompt_texts", &texts)
	if plan.IsTimed(jc.spec.GetPrompt()) != (len(st.Prompts) > 0) || len(st.Prompts) > 0 && len(st.Prompts) != len(texts) {
		t.Errorf("settings prompts %v for prompt %q", st.Prompts, jc.spec.GetPrompt())
	}
	if len(end) == 0 {
		if st.EndFrame != nil {
			t.Errorf("settings name an end frame %v, the job has none", st.EndFrame)
		}
		return
	}
	sum := sha256.Sum256(end)
	if st.EndFrame == nil || st.EndFrame.SHA256 != hex.EncodeToString(sum[:]) || st.EndFrame.Strength != jc.spec.GetEndStrength() {
		t.Fatalf("settings end frame %+v, want the image's sha256 and strength %g", st.EndFrame, jc.spec.GetEndStrength())
	}
	if b, err := os.ReadFile(st.EndFrame.Image); err != nil || !slices.Equal(b, end) {
		t.Errorf("settings end frame image %s: %v (want the submitted bytes)", st.EndFrame.Image, err)
	}
}
