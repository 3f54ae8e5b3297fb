package pipeline_test

import (
	"bytes"
	"context"
	"fmt"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// opI2V is the op of the pipeline fixture's cases.
const opI2V = "pipeline.framepack_i2v"

// jobTimeout bounds one tiny-model job.
const jobTimeout = 3 * time.Minute

// i2vCase is a pipeline case as a job: its spec, input image and what to expect.
type i2vCase struct {
	c        parity.Case
	spec     *framepackv1.JobSpec
	image    []byte
	window   int
	sections []int // the latent paddings the reference used
}

func loadCase(t *testing.T, c parity.Case) i2vCase {
	t.Helper()
	var (
		hw                   [2]int
		seed                 int64
		seconds, cfg, gs, rs float64
		window, steps, res   int
		buckets              [][2]int
		sections             []int
	)
	for name, v := range map[string]any{"image_hw": &hw, "seed": &seed, "seconds": &seconds, "latent_window_size": &window,
		"steps": &steps, "cfg": &cfg, "gs": &gs, "rs": &rs, "resolution": &res, "buckets": &buckets, "sections": &sections} {
		if !c.Param(t, name, v) {
			t.Fatalf("case %s: no param %q", c.Name, name)
		}
	}
	teacache := false // the fixture's sampler runs without TeaCache unless the case says so
	c.Param(t, "use_teacache", &teacache)
	var prompt string
	c.InputValue(t, "prompt", &prompt)
	img := c.Input(t, "image_hwc_u8")
	if !parity.SameShape(img.Shape, []int64{int64(hw[0]), int64(hw[1]), 3}) {
		t.Fatalf("case %s: image %v, params say %v", c.Name, img.Shape, hw)
	}
	spec := &framepackv1.JobSpec{Prompt: prompt, Seed: proto.Int64(seed), TotalSecondLength: float32(seconds), LatentWindowSize: uint32(window),
		Steps: uint32(steps), Cfg: float32(cfg), Gs: float32(gs), Rs: float32(rs), Resolution: uint32(res),
		UseTeacache: proto.Bool(teacache), ImageFilename: "start.png"}
	for _, b := range buckets {
		spec.Buckets = append(spec.Buckets, &framepackv1.Bucket{Height: uint32(b[0]), Width: uint32(b[1])})
	}
	return i2vCase{c: c, spec: spec, image: pngOf(t, img.Ints, hw[0], hw[1]), window: window, sections: sections}
}

// checkChildren returns an OnStage hook that records every stage and any child process alive
// after it (a worker that outlived its stage).
type stageLog struct {
	mu       sync.Mutex
	records  []pipeline.StageRecord
	leftover []string
}

func (s *stageLog) onStage(r pipeline.StageRecord) {
	kids, err := lanes.Children(os.Getpid())
	s.mu.Lock()
	defer s.mu.Unlock()
	s.records = append(s.records, r)
	if err != nil || len(kids) > 0 {
		s.leftover = append(s.leftover, fmt.Sprintf("after %s section %d: children %v (%v)", r.Name, r.Section, kids, err))
	}
}

// runJob submits the case to a daemon and watches it to its end.
func runJob(t testing.TB, jc i2vCase, socket string) (*framepackv1.Job, []*framepackv1.JobEvent) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), jobTimeout)
	defer cancel()
	c := client(t, socket)
	resp, err := c.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: jc.image, Spec: jc.spec})
	if err != nil {
		t.Fatalf("submit: %v", err)
	}
	var evs []*framepackv1.JobEvent
	last, err := watch(ctx, c, resp.GetJob().GetId(), func(ev *framepackv1.JobEvent) bool { evs = append(evs, ev); return true })
	if err != nil {
		t.Fatalf("watch: %v", err)
	}
	if f := last.GetJobFailed(); f != nil {
		t.Fatalf("job failed: %v", f.GetFailure())
	}
	if last.GetJobFinished() == nil {
		t.Fatalf("job ended with %v", last)
	}
	got, err := c.GetJob(ctx, &framepackv1.GetJobRequest{JobId: resp.GetJob().GetId()})
	if err != nil {
		t.Fatal(err)
	}
	return got.GetJob(), evs
}

// jobFiles reads what a finished job left in its history directory.
type jobFiles struct {
	cond     *safetensors.File
	sections []*safetensors.File
}

func openJobFiles(t *testing.T, state, id string, n int) jobFiles {
	t.Helper()
	hist := filepath.Join(state, "jobs", id, "history")
	open := func(name string) *safetensors.File {
		f, err := safetensors.Open(filepath.Join(hist, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	jf := jobFiles{cond: open(pipeline.ConditioningFile)}
	for i := range n {
		jf.sections = append(jf.sections, open(pipeline.SectionFile(i)))
	}
	return jf
}

func read(t *testing.T, f *safetensors.File, name string) ([]float32, []int64) {
	t.Helper()
	v, shape, err := f.Float32(name)
	if err != nil {
		t.Fatal(err)
	}
	return v, shape
}

// framesT returns frames [t0, t1) of a [B, C, T, H, W] tensor.
func framesT(v []float32, shape []int64, t0, t1 int) ([]float32, []int64) {
	b, c, t, h, w := int(shape[0]), int(shape[1]), int(shape[2]), int(shape[3]), int(shape[4])
	out := make([]float32, 0, b*c*(t1-t0)*h*w)
	for bc := range b * c {
		out = append(out, v[(bc*t+t0)*h*w:(bc*t+t1)*h*w]...)
	}
	return out, []int64{int64(b), int64(c), int64(t1 - t0), int64(h), int64(w)}
}

// logIntermediate logs the rel_l2 of an intermediate (matching them is not required; they
// show where a mismatch starts).
func logIntermediate(t *testing.T, c parity.Case, name string, got []float32, shape []int64) float64 {
	t.Helper()
	want := c.Intermediate(t, name)
	if !parity.SameShape(shape, want.Shape) {
		t.Errorf("case %s intermediate %s: shape %v, want %v", c.Name, name, shape, want.Shape)
		return math.Inf(1)
	}
	e := parity.RelL2(got, want.F32)
	t.Logf("case %s intermediate %s: rel_l2=%.3g tol=%.3g", c.Name, name, e, c.Tolerance.RelL2)
	return e
}

// checkPaddings checks that the job ran the sections the reference ran (the same latent
// paddings) and returns how many.
func checkPaddings(t *testing.T, jc i2vCase, job *framepackv1.Job) int {
	t.Helper()
	total := int(job.GetProgress().GetTotalSections())
	if got := plan.Paddings(total); !slices.Equal(got, jc.sections) {
		t.Fatalf("paddings %v, the reference used %v", got, jc.sections)
	}
	return total
}

// readHistory reads a section file's history latents and how many of their frames are generated.
func readHistory(t *testing.T, f *safetensors.File) ([]float32, []int64, int) {
	t.Helper()
	lat, shape := read(t, f, "history_latents")
	gen, err := strconv.Atoi(f.Metadata()["total_generated_latent_frames"])
	if err != nil {
		t.Fatal(err)
	}
	return lat, shape, gen
}

// checkPixels compares the final section's decoded pixels with the case's "pixels" output, and
// the uint8 frames they round to with "frames_u8" (at most 1 apart); it returns the pixels' shape.
func checkPixels(t *testing.T, c parity.Case, final *safetensors.File) []int64 {
	t.Helper()
	px, pshape := read(t, final, "history_pixels")
	c.Check(t, "pixels", px, pshape, c.Output(t, "pixels"))
	u8, err := imageproc.PixelsToUint8(imageproc.Video{B: int(pshape[0]), C: int(pshape[1]), T: int(pshape[2]), H: int(pshape[3]), W: int(pshape[4]), Data: px})
	if err != nil {
		t.Fatal(err)
	}
	want := c.Output(t, "frames_u8")
	got := make([]float32, len(u8))
	for i, b := range u8 {
		got[i] = float32(b)
	}
	if !parity.SameShape(pshape, want.Shape) {
		t.Fatalf("frames %v, want %v", pshape, want.Shape)
	}
	d, n := parity.MaxAbsDiff(got, want.F32)
	t.Logf("case %s frames_u8: max diff %v, %d of %d values differ, rel_l2=%.3g", c.Name, d, n, len(got), parity.RelL2(got, want.F32))
	if d > 1 {
		t.Errorf("case %s frames_u8: max diff %v (%d values differ), want at most 1", c.Name, d, n)
	}
	return pshape
}

func TestParityPipeline(t *testing.T) {
	fx := parity.Load(t, "pipeline")
	workers := buildWorkers(t)
	ran := 0
	for _, c := range fx.Cases {
		if c.Op != opI2V {
			continue
		}
		ran++
		t.Run(c.Name, func(t *testing.T) {
			jc := loadCase(t, c)
			opts, job, evs := runParityJob(t, workers, jc)

			total := checkPaddings(t, jc, job)
			checkEvents(t, jc, evs, total)
			checkOutputs(t, jc, opts.State, job, total)
		})
	}
	if ran == 0 {
		t.Fatalf("fixture %s has no %s case", fx.Name, opI2V)
	}
}

// runParityJob runs a case's job through a daemon of its own with the given workers, then
// checks that no worker outlived its stage and shared memory is empty; it returns the daemon's
// options, the finished job and its events; the daemon is killed when the test ends.
func runParityJob(t *testing.T, workers map[lanes.Model]string, jc i2vCase) (daemonOpts, *framepackv1.Job, []*framepackv1.JobEvent) {
	t.Helper()
	opts := newOpts(t, workers)
	var stages stageLog
	opts.onStage = stages.onStage
	d, err := newDaemon(opts, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.Kill) // after the caller's checks, as a deferred Kill in the subtest was
	t0 := time.Now()
	job, evs := runJob(t, jc, opts.Socket)
	t.Logf("case %s: job %s took %v", jc.c.Name, job.GetId(), time.Since(t0).Round(time.Millisecond))
	stages.mu.Lock()
	for _, l := range stages.leftover {
		t.Errorf("worker outlived its stage: %s", l)
	}
	stages.mu.Unlock()
	if err := shmEmpty(opts.Shm); err != nil {
		t.Error(err)
	}
	return opts, job, evs
}

// checkEvents checks the job's event stream: every stage started and finished with timings,
// a sampling step with an ETA and a preview per step, a video per section, memory telemetry.
func checkEvents(t *testing.T, jc i2vCase, evs []*framepackv1.JobEvent, total int) {
	t.Helper()
	steps := int(jc.spec.GetSteps())
	started := map[string]int{}
	finished := map[string]int{}
	var samplingSteps, previews, videos, telemetry int
	for _, ev := range evs {
		switch e := ev.GetEvent().(type) {
		case *framepackv1.JobEvent_StageStarted:
			started[e.StageStarted.GetStage().String()]++
		case *framepackv1.JobEvent_StageFinished:
			f := e.StageFinished
			finished[f.GetStage().String()]++
			if f.GetDuration().AsDuration() <= 0 || f.GetComputeDuration().AsDuration() <= 0 {
				t.Errorf("stage finished without timings: %v", f)
			}
			if f.GetStage() != framepackv1.Stage_STAGE_PREPARE && f.GetStage() != framepackv1.Stage_STAGE_WRITE_VIDEO && f.GetLoadDuration().AsDuration() <= 0 {
				t.Errorf("worker stage finished without load time: %v", f)
			}
		case *framepackv1.JobEvent_SamplingStep:
			samplingSteps++
			if e.SamplingStep.GetEta() == nil || e.SamplingStep.GetStepDuration().AsDuration() <= 0 || int(e.SamplingStep.GetTotalSteps()) != steps {
				t.Errorf("sampling step %v", e.SamplingStep)
			}
		case *framepackv1.JobEvent_Preview:
			previews++
			img, err := png.Decode(bytes.NewReader(e.Preview.GetPng()))
			if err != nil {
				t.Errorf("preview: %v", err)
				continue
			}
			// vae_decode_fake at latent resolution, laid out '(b h) (t w) c'.
			np := jc.c.Intermediate(t, "image_np").Shape
			if b := img.Bounds(); b.Dx() != jc.window*int(np[1])/8 || b.Dy() != int(np[0])/8 {
				t.Errorf("preview %dx%d, want %dx%d", b.Dx(), b.Dy(), jc.window*int(np[1])/8, np[0]/8)
			}
		case *framepackv1.JobEvent_SectionVideo:
			videos++
			// The last section's video is the job's; each earlier one was superseded by the
			// next (which holds all its frames) and removed.
			_, err := os.Stat(e.SectionVideo.GetPath())
			if last := int(e.SectionVideo.GetSectionIndex()) == total-1; last && err != nil {
				t.Errorf("final section video: %v", err)
			} else if !last && !os.IsNotExist(err) {
				t.Errorf("superseded section video %s kept: %v", e.SectionVideo.GetPath(), err)
			}
		case *framepackv1.JobEvent_MemoryTelemetry:
			telemetry++
			if e.MemoryTelemetry.GetWorkerRssBytes() == 0 {
				t.Errorf("memory telemetry without rss: %v", e.MemoryTelemetry)
			}
		}
	}
	perJob := []framepackv1.Stage{framepackv1.Stage_STAGE_TEXT_ENCODE, framepackv1.Stage_STAGE_PREPARE, framepackv1.Stage_STAGE_VAE_ENCODE, framepackv1.Stage_STAGE_IMAGE_ENCODE}
	perSection := []framepackv1.Stage{framepackv1.Stage_STAGE_TRANSFORMER, framepackv1.Stage_STAGE_VAE_DECODE, framepackv1.Stage_STAGE_WRITE_VIDEO}
	for _, s := range perJob {
		if started[s.String()] != 1 || finished[s.String()] != 1 {
			t.Errorf("%s started %d finished %d times, want 1", s, started[s.String()], finished[s.String()])
		}
	}
	for _, s := range perSection {
		if started[s.String()] != total || finished[s.String()] != total {
			t.Errorf("%s started %d finished %d times, want %d", s, started[s.String()], finished[s.String()], total)
		}
	}
	if samplingSteps != steps*total || previews != steps*total || videos != total || telemetry == 0 {
		t.Errorf("%d sampling steps, %d previews, %d section videos, %d telemetry events; want %d, %d, %d, > 0",
			samplingSteps, previews, videos, telemetry, steps*total, steps*total, total)
	}
}

// checkOutputs compares the job's files with the case: intermediates logged, history latents
// within the tolerance, frames exact or within 1.
func checkOutputs(t *testing.T, jc i2vCase, state string, job *framepackv1.Job, total int) {
	t.Helper()
	c := jc.c
	jf := openJobFiles(t, state, job.GetId(), total)
	for name, tensor := range map[string]string{"llama_vec": "llama_vec", "clip_pooler": "clip_pooler", "start_latent": "start_latent", "image_hidden": "image_embeddings"} {
		v, shape := read(t, jf.cond, tensor)
		logIntermediate(t, c, name, v, shape)
	}
	npImg, npShape := read(t, jf.cond, "image_np")
	logIntermediate(t, c, "image_np", npImg, npShape)
	if want := c.Intermediate(t, "image_np"); parity.SameShape(npShape, want.Shape) {
		if d, n := parity.MaxAbsDiff(npImg, want.F32); d > 1 {
			t.Errorf("case %s image_np: max diff %v (%d pixels differ)", c.Name, d, n)
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
		if key := fmt.Sprintf("section%d_latents", i); c.Intermediates[key] != nil {
			logIntermediate(t, c, key, v, s)
		}
		px, pshape := read(t, f, "history_pixels")
		if key := fmt.Sprintf("section%d_pixels", i); c.Intermediates[key] != nil {
			logIntermediate(t, c, key, px, pshape)
		}
	}
	final := jf.sections[total-1]
	lat, shape, gen := readHistory(t, final)
	v, s := framesT(lat, shape, 0, gen)
	c.Check(t, "history_latents", v, s, c.Output(t, "history_latents"))
	pshape := checkPixels(t, c, final)
	if r := job.GetResult(); int(r.GetFrameCount()) != int(pshape[2]) {
		t.Errorf("result frame count %d, frames %d", r.GetFrameCount(), pshape[2])
	} else if _, err := os.Stat(r.GetVideoPath()); err != nil {
		t.Errorf("result video: %v", err)
	}
}
