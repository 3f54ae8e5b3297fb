package pipeline_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/pipeline"
)

// opF1 is the op of the pipeline_f1 fixture's cases.
const opF1 = "pipeline.framepack_f1"

// loadF1Case reads a pipeline_f1 case as a job of variant f1.
func loadF1Case(t *testing.T, c parity.Case) (i2vCase, int) {
	t.Helper()
	var (
		hw                   [2]int
		seed                 int64
		seconds, cfg, gs, rs float64
		window, steps, res   int
		buckets              [][2]int
		sections             int
		variant              string
	)
	for name, v := range map[string]any{"image_hw": &hw, "seed": &seed, "seconds": &seconds, "latent_window_size": &window,
		"steps": &steps, "cfg": &cfg, "gs": &gs, "rs": &rs, "resolution": &res, "buckets": &buckets, "sections": &sections,
		"variant": &variant} {
		if !c.Param(t, name, v) {
			t.Fatalf("case %s: no param %q", c.Name, name)
		}
	}
	if variant != pipeline.VariantF1 {
		t.Fatalf("case %s: variant %q", c.Name, variant)
	}
	var negative string
	c.Param(t, "n_prompt", &negative)
	teacache := false
	c.Param(t, "use_teacache", &teacache)
	var prompt string
	c.InputValue(t, "prompt", &prompt)
	img := c.Input(t, "image_hwc_u8")
	if !parity.SameShape(img.Shape, []int64{int64(hw[0]), int64(hw[1]), 3}) {
		t.Fatalf("case %s: image %v, params say %v", c.Name, img.Shape, hw)
	}
	spec := &framepackv1.JobSpec{Prompt: prompt, NegativePrompt: negative, Seed: proto.Int64(seed), TotalSecondLength: float32(seconds),
		LatentWindowSize: uint32(window), Steps: uint32(steps), Cfg: float32(cfg), Gs: float32(gs), Rs: float32(rs),
		Resolution: uint32(res), UseTeacache: proto.Bool(teacache), ImageFilename: "start.png", Variant: variant}
	for _, b := range buckets {
		spec.Buckets = append(spec.Buckets, &framepackv1.Bucket{Height: uint32(b[0]), Width: uint32(b[1])})
	}
	return i2vCase{c: c, spec: spec, image: pngOf(t, img.Ints, hw[0], hw[1]), window: window}, sections
}

// TestParityPipelineF1 runs every case of the pipeline_f1 fixture (FramePack-F1's loop, sections
// forwards in time, with the F1 transformer) as a job of variant f1 through a daemon with real
// workers, and checks it section by section: each section's generated latents (the newest
// window of the history) and the pixels so far within the case's tolerance, then the final
// real history, pixels and uint8 frames; the events as for the i2v pipeline.
func TestParityPipelineF1(t *testing.T) {
	fx := parity.Load(t, "pipeline_f1")
	workers := buildWorkers(t)
	ran := 0
	for _, c := range fx.Cases {
		switch c.Op {
		case opF1:
		default:
			t.Errorf("case %s: unknown op %q", c.Name, c.Op)
			continue
		}
		ran++
		t.Run(c.Name, func(t *testing.T) {
			jc, sections := loadF1Case(t, c)
			opts, job, evs := runParityJob(t, workers, jc)
			if job.GetSpec().GetVariant() != pipeline.VariantF1 {
				t.Errorf("stored spec variant %q", job.GetSpec().GetVariant())
			}
			total := int(job.GetProgress().GetTotalSections())
			if total != sections {
				t.Fatalf("%d sections, the reference ran %d", total, sections)
			}
			checkEvents(t, jc, evs, total)
			checkOutputsF1(t, jc, opts.State, job, total)
		})
	}
	if ran == 0 {
		t.Fatalf("fixture %s has no %s case", fx.Name, opF1)
	}
}

// checkOutputsF1 compares an F1 job's files with the case, section by section.
func checkOutputsF1(t *testing.T, jc i2vCase, state string, job *framepackv1.Job, total int) {
	t.Helper()
	c := jc.c
	jf := openJobFiles(t, state, job.GetId(), total)
	for name, tensor := range map[string]string{"llama_vec": "llama_vec", "clip_pooler": "clip_pooler", "start_latent": "start_latent", "image_hidden": "image_embeddings"} {
		v, shape := read(t, jf.cond, tensor)
		logIntermediate(t, c, name, v, shape)
	}
	w := jc.window
	for i, f := range jf.sections {
		lat, shape := read(t, f, "history_latents")
		n := int(shape[2])
		v, s := framesT(lat, shape, n-w, n) // the section's window is the newest
		c.Check(t, fmt.Sprintf("section%d_latents", i), v, s, c.Intermediate(t, fmt.Sprintf("section%d_latents", i)))
		px, pshape := read(t, f, "history_pixels")
		c.Check(t, fmt.Sprintf("section%d_pixels", i), px, pshape, c.Intermediate(t, fmt.Sprintf("section%d_pixels", i)))
	}
	final := jf.sections[total-1]
	lat, shape, gen := readHistory(t, final)
	if gen != 1+total*w {
		t.Errorf("total_generated_latent_frames %d, want the start latent and %d windows of %d", gen, total, w)
	}
	v, s := framesT(lat, shape, int(shape[2])-gen, int(shape[2])) // real_history_latents
	c.Check(t, "history_latents", v, s, c.Output(t, "history_latents"))
	pshape := checkPixels(t, c, final)
	if r := job.GetResult(); int(r.GetFrameCount()) != int(pshape[2]) {
		t.Errorf("result frame count %d, frames %d", r.GetFrameCount(), pshape[2])
	}
	// The settings beside the video name the variant and the F1 transformer.
	mp4 := job.GetResult().GetVideoPath()
	raw, err := os.ReadFile(strings.TrimSuffix(mp4, filepath.Ext(mp4)) + ".json")
	if err != nil {
		t.Fatal(err)
	}
	var st pipeline.Settings
	if err := json.Unmarshal(raw, &st); err != nil || st.Variant != pipeline.VariantF1 || filepath.Base(st.Models["transformer"]) != "framepack_f1" {
		t.Errorf("settings %s (%v): want variant f1 with the F1 transformer", raw, err)
	}
}

// TestSubmitVariant checks JobSpec.variant at submit: an unknown variant and f1 on a server
// without the F1 transformer are refused with INVALID_ARGUMENT saying why.
func TestSubmitVariant(t *testing.T) {
	fx := parity.Load(t, "pipeline_f1")
	jc, _ := loadF1Case(t, fx.Cases[0])
	workers := buildWorkers(t)
	opts := newOpts(t, workers)
	// A models folder with the i2v models only: links to the fixture's.
	only := t.TempDir()
	for _, m := range []string{"hunyuanvideo", "flux_redux_bfl", "framepack_i2v"} {
		if err := symlink(opts.Models, only, m); err != nil {
			t.Fatal(err)
		}
	}
	opts.Models = only
	d, err := newDaemon(opts, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	cl := client(t, opts.Socket)
	for _, tc := range []struct{ variant, want string }{
		{"f1", "FramePack_F1_I2V_HY_20250503"},
		{"f2", `unknown sampling variant "f2"`},
	} {
		spec := proto.Clone(jc.spec).(*framepackv1.JobSpec)
		spec.Variant = tc.variant
		_, err := cl.SubmitJob(t.Context(), &framepackv1.SubmitJobRequest{Image: jc.image, Spec: spec})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "spec.variant") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("submit variant %q: %v, want INVALID_ARGUMENT on spec.variant saying %q", tc.variant, err, tc.want)
		}
	}
}

// symlink links from/name as to/name.
func symlink(from, to, name string) error {
	return os.Symlink(filepath.Join(from, name), filepath.Join(to, name))
}
