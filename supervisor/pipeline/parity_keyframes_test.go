package pipeline_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// opKeyframes is the op of the pipeline_keyframes reference fixture's cases.
const opKeyframes = "pipeline.keyframes_i2v"

// keyframeParam is one entry of a keyframes case's params.keyframes: as the job gives it.
type keyframeParam struct {
	Section *uint32  `json:"section"`
	Seconds *float32 `json:"seconds"`
	ImageHW [2]int   `json:"image_hw"`
}

// loadKeyframesCase reads a pipeline_keyframes case as an i2v job with keyframes (and the end
// frame, when the case has one); it returns the keyframes' sections (video time).
func loadKeyframesCase(t *testing.T, c parity.Case) (i2vCase, []int) {
	t.Helper()
	jc := loadStudioCase(t, c)
	var kps []keyframeParam
	var sections []int
	if !c.Param(t, "keyframes", &kps) || !c.Param(t, "keyframe_sections", &sections) || len(kps) != len(sections) {
		t.Fatalf("case %s: keyframes %v for sections %v", c.Name, kps, sections)
	}
	for j, kp := range kps {
		img := c.Input(t, fmt.Sprintf("keyframe%d_hwc_u8", j))
		if !parity.SameShape(img.Shape, []int64{int64(kp.ImageHW[0]), int64(kp.ImageHW[1]), 3}) {
			t.Fatalf("case %s: keyframe %d is %v, params say %v", c.Name, j, img.Shape, kp.ImageHW)
		}
		k := &framepackv1.Keyframe{Image: pngOf(t, img.Ints, kp.ImageHW[0], kp.ImageHW[1])}
		switch {
		case kp.Section != nil:
			k.At = &framepackv1.Keyframe_Section{Section: *kp.Section}
		case kp.Seconds != nil:
			k.At = &framepackv1.Keyframe_Seconds{Seconds: *kp.Seconds}
		default:
			t.Fatalf("case %s: keyframe %d has neither section nor seconds", c.Name, j)
		}
		jc.spec.Keyframes = append(jc.spec.Keyframes, k)
	}
	return jc, sections
}

// TestParityPipelineKeyframes runs every case of the pipeline_keyframes reference fixture
// (FramePack's i2v loop with FramePack-eichi's keyframes, given by section or by time, with
// FramePack-Studio's end frame and a timed prompt) through a daemon with real workers and checks
// it section by section: each keyframe's bucketed image and latent, each section's latents, the
// history, pixels and frames within the case's tolerance, and the settings beside the video.
func TestParityPipelineKeyframes(t *testing.T) {
	fx := loadReferenceOrSkip(t, "pipeline_keyframes", featuresScript)
	workers := buildWorkers(t)
	ran := 0
	for _, c := range fx.Cases {
		if c.Op != opKeyframes {
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
			continue
		}
		ran++
		t.Run(c.Name, func(t *testing.T) {
			jc, sections := loadKeyframesCase(t, c)
			end := jc.spec.GetEndImage()
			opts, job, evs := runParityJob(t, workers, jc)
			total := checkPaddings(t, jc, job)
			for _, k := range job.GetSpec().GetKeyframes() {
				if len(k.GetImage()) != 0 || len(k.GetImageSha256()) != 64 {
					t.Errorf("stored keyframe %v: want its hash, not its bytes", k)
				}
			}
			checkEvents(t, jc, evs, total)
			checkOutputsStudio(t, jc, opts.State, job.GetId(), total)
			jf := openJobFiles(t, opts.State, job.GetId(), total)
			if got := jf.cond.Metadata()["keyframe_sections"]; got != strings.Trim(strings.Join(strings.Fields(fmt.Sprint(sections)), ","), "[]") {
				t.Errorf("conditioning keyframe_sections %q, want %v", got, sections)
			}
			for i, s := range sections {
				np, shape := read(t, jf.cond, fmt.Sprintf("keyframe_np.%d", i))
				want := c.Intermediate(t, fmt.Sprintf("keyframe%d_np", s))
				if d, n := parity.MaxAbsDiff(np, want.F32); !parity.SameShape(shape, want.Shape) || d > 1 {
					t.Errorf("keyframe %d (section %d) image: shape %v, max diff %v (%d values)", i, s, shape, d, n)
				}
				lat, lshape := read(t, jf.cond, fmt.Sprintf("keyframe_latent.%d", i))
				c.Check(t, fmt.Sprintf("keyframe%d_latent", s), lat, lshape, c.Intermediate(t, fmt.Sprintf("keyframe%d_latent", s)))
			}
			checkSettingsStudio(t, jc, job.GetResult().GetVideoPath(), end)
			checkSettingsKeyframes(t, job, sections)
		})
	}
	if ran == 0 {
		t.Fatalf("fixture %s has no %s case", fx.Name, opKeyframes)
	}
}

// checkSettingsKeyframes checks the settings beside a job's video list its keyframes' sections
// and images.
func checkSettingsKeyframes(t *testing.T, job *framepackv1.Job, sections []int) {
	t.Helper()
	mp4 := job.GetResult().GetVideoPath()
	raw, err := os.ReadFile(strings.TrimSuffix(mp4, filepath.Ext(mp4)) + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var st pipeline.Settings
	if err := json.Unmarshal(raw, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Keyframes) != len(sections) {
		t.Fatalf("settings keyframes %+v, want sections %v", st.Keyframes, sections)
	}
	for i, k := range st.Keyframes {
		if k.Section != sections[i] || k.SHA256 != job.GetSpec().GetKeyframes()[i].GetImageSha256() {
			t.Errorf("settings keyframe %d: %+v, want section %d", i, k, sections[i])
		}
		if _, err := os.Stat(k.Image); err != nil {
			t.Errorf("settings keyframe %d image: %v", i, err)
		}
	}
}

// TestKeyframeJobs runs the pipeline fixture's first case with keyframes through a daemon with
// real workers (no reference needed): the start image as the keyframe of section 0 gives every
// section the start latent again, so the output is bit for bit the job's without keyframes; a
// different image as the keyframe of the last section changes it, and the job records it.
func TestKeyframeJobs(t *testing.T) {
	fx := parity.Load(t, "pipeline")
	workers := buildWorkers(t)
	var jc i2vCase
	for _, c := range fx.Cases {
		if c.Op == opI2V {
			jc = loadCase(t, c)
			break
		}
	}
	if jc.spec == nil {
		t.Fatalf("fixture %s has no %s case", fx.Name, opI2V)
	}
	run := func(keyframes ...*framepackv1.Keyframe) ([]float32, *framepackv1.Job, string) {
		t.Helper()
		c := jc
		c.spec = proto.Clone(jc.spec).(*framepackv1.JobSpec)
		c.spec.Keyframes = keyframes
		opts, job, _ := runParityJob(t, workers, c)
		total := int(job.GetProgress().GetTotalSections())
		lat, _, _ := readHistory(t, openJobFiles(t, opts.State, job.GetId(), total).sections[total-1])
		return lat, job, opts.State
	}
	plain, _, _ := run()
	same, job, _ := run(&framepackv1.Keyframe{At: &framepackv1.Keyframe_Section{Section: 0}, Image: jc.image})
	if d, n := parity.MaxAbsDiff(same, plain); d != 0 {
		t.Errorf("the start image as section 0's keyframe changed the history latents: max diff %v (%d values)", d, n)
	}
	checkSettingsKeyframes(t, job, []int{0})
	last := len(jc.sections) - 1
	other := flippedPNG(t, jc)
	moved, job2, _ := run(&framepackv1.Keyframe{At: &framepackv1.Keyframe_Seconds{Seconds: 0}, Image: jc.image},
		&framepackv1.Keyframe{At: &framepackv1.Keyframe_Section{Section: uint32(last)}, Image: other})
	if e := parity.RelL2(moved, plain); e == 0 {
		t.Errorf("a different keyframe for section %d left the history latents as they were", last)
	}
	checkSettingsKeyframes(t, job2, []int{0, last})
}

// flippedPNG is the case's start image upside down, as PNG.
func flippedPNG(t *testing.T, jc i2vCase) []byte {
	t.Helper()
	img := jc.c.Input(t, "image_hwc_u8")
	h, w := int(img.Shape[0]), int(img.Shape[1])
	flipped := make([]int64, len(img.Ints))
	for y := range h {
		copy(flipped[y*w*3:(y+1)*w*3], img.Ints[(h-1-y)*w*3:(h-y)*w*3])
	}
	return pngOf(t, flipped, h, w)
}
