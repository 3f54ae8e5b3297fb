package pipeline_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/framepackd/framepackd/internal/parity"
	"github.com/framepackd/framepackd/internal/safetensors"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline"
	"github.com/framepackd/framepackd/supervisor/video"
)

// firstCase returns the first pipeline case of the fixture set.
func firstCase(t *testing.T) i2vCase {
	t.Helper()
	fx := parity.Load(t, "pipeline")
	for _, c := range fx.Cases {
		if c.Op == opI2V {
			return loadCase(t, c)
		}
	}
	t.Fatalf("fixture %s has no %s case", fx.Name, opI2V)
	return i2vCase{}
}

// finalPixels is a finished job's output: the history latents of its last section file (the
// retained ones, f32) followed by the frames of its video, each byte a value: two runs that
// computed the same pixels wrote the same frames.
func finalPixels(t *testing.T, state, id string, total int) []float32 {
	t.Helper()
	f, err := safetensors.Open(filepath.Join(state, "jobs", id, "history", pipeline.SectionFile(total-1)))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	v, _, err := f.Float32("history_latents")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(state, "jobs", id, "video", fmt.Sprintf("section-%03d.mp4", total-1))
	if _, err := os.Stat(path); err != nil {
		path = video.FramesDir(path)
	}
	frames, err := (&video.Writer{}).ReadFrames(t.Context(), path)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range frames {
		v = append(v, float32(b))
	}
	return v
}

// stageRecords reads a job's stages file.
func stageRecords(t *testing.T, state, id string) []pipeline.StageRecord {
	t.Helper()
	f, err := os.Open(filepath.Join(state, "jobs", id, "history", pipeline.StagesFile))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []pipeline.StageRecord
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r pipeline.StageRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("stages file: %v", err)
		}
		out = append(out, r)
	}
	return out
}

// partials lists "*.partial" files under dir.
func partials(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(p, ".partial") {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestResumeAfterSupervisorKill kills the supervisor process (SIGKILL) once the job's first
// section is checkpointed, starts it again on the same state directory and checks that the job
// resumes there and ends with the same frames as an uninterrupted run, that no worker outlived
// the killed supervisor, and that no shared memory is left.
func TestResumeAfterSupervisorKill(t *testing.T) {
	resumeAfterKill(t, firstCase(t))
}

// TestResumeF1AfterSupervisorKill is TestResumeAfterSupervisorKill for a job of variant f1
// (the pipeline_f1 fixture's two-section case): the checkpoint records the variant and the
// resumed job ends with the same frames, byte for byte, as an uninterrupted run.
func TestResumeF1AfterSupervisorKill(t *testing.T) {
	fx := parity.Load(t, "pipeline_f1")
	var jc i2vCase
	for _, c := range fx.Cases {
		if n := 0; c.Op == opF1 && c.Param(t, "sections", &n) && n == 2 {
			jc, _ = loadF1Case(t, c)
		}
	}
	if jc.spec == nil {
		t.Fatalf("fixture %s has no two-section %s case", fx.Name, opF1)
	}
	resumeAfterKill(t, jc)
}

// TestResumeEndFrameAfterSupervisorKill is TestResumeAfterSupervisorKill for a job with an
// end frame (the pipeline_studio reference's first end-frame case): the end latent sits in the
// history the checkpoint keeps and in the conditioning file, so the sections after the restart
// (whose 2x/4x context holds it) end with the same frames, byte for byte.
func TestResumeEndFrameAfterSupervisorKill(t *testing.T) {
	fx := parity.LoadReference(t, "pipeline_studio")
	for _, c := range fx.Cases {
		if c.Op == opStudio && c.HasInput("end_image_hwc_u8") {
			resumeAfterKill(t, loadStudioCase(t, c))
			return
		}
	}
	t.Fatalf("fixture %s has no end-frame case", fx.Name)
}

// resumeAfterKill runs jc uninterrupted, then again in a daemon process killed after the first
// section video, and checks the resumed job (see TestResumeAfterSupervisorKill).
func resumeAfterKill(t *testing.T, jc i2vCase) {
	workers := buildWorkers(t)

	// The uninterrupted run, in this process.
	ref := newOpts(t, workers)
	ref.KeepHistory = false
	d, err := newDaemon(ref, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	refJob, _ := runJob(t, jc, ref.Socket)
	d.Kill()
	total := int(refJob.GetProgress().GetTotalSections())
	if total < 2 {
		t.Skipf("case %s has %d section: nothing to resume", jc.c.Name, total)
	}
	want := finalPixels(t, ref.State, refJob.GetId(), total)

	// The killed run, in a daemon process.
	o := newOpts(t, workers)
	o.KeepHistory = false
	proc := startDaemonProcess(t, o)
	ctx, cancel := context.WithTimeout(t.Context(), jobTimeout)
	defer cancel()
	c := client(t, o.Socket)
	resp, err := c.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: jc.image, Spec: jc.spec})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJob().GetId()
	killed := false
	_, err = watch(ctx, c, id, func(ev *framepackv1.JobEvent) bool {
		if sv := ev.GetSectionVideo(); sv != nil && sv.GetSectionIndex() == 0 {
			if err := proc.Process.Signal(syscall.SIGKILL); err != nil {
				t.Errorf("kill daemon: %v", err)
			}
			killed = true
			return false
		}
		return true
	})
	if !killed {
		t.Fatalf("job ended before its first section video: %v", err)
	}
	_ = proc.Wait()
	if err := waitNoWorkers(workers, 5*time.Second); err != nil {
		t.Fatalf("after the supervisor's SIGKILL: %v", err)
	}

	// Restart on the same state directory: the job is taken up again and resumes.
	proc = startDaemonProcess(t, o)
	c = client(t, o.Socket)
	last, err := watch(ctx, c, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if last.GetJobFinished() == nil {
		t.Fatalf("resumed job ended with %v", last)
	}
	got := finalPixels(t, o.State, id, total)
	if !slices.Equal(got, want) {
		d, n := parity.MaxAbsDiff(got, want)
		t.Fatalf("resumed job's pixels differ from the uninterrupted run's: max diff %g, %d values", d, n)
	}
	t.Logf("case %s: resumed after section 0; final latents and video frames identical to the uninterrupted run (%d values)", jc.c.Name, len(got))
	if len(jc.spec.GetEndImage()) > 0 {
		cond, err := safetensors.Open(filepath.Join(o.State, "jobs", id, "history", pipeline.ConditioningFile))
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := cond.Info("end_latent"); !ok {
			t.Error("the resumed job's conditioning file has no end_latent")
		}
		cond.Close()
	}

	// The encoders ran once; the restarted supervisor began with section 1.
	recs := stageRecords(t, o.State, id)
	count := map[string]int{}
	for _, r := range recs {
		count[r.Name]++
	}
	if count[framepackv1.Stage_STAGE_TEXT_ENCODE.String()] != 1 || count[framepackv1.Stage_STAGE_IMAGE_ENCODE.String()] != 1 {
		t.Errorf("encoders ran again after the restart: %v", count)
	}
	for _, r := range recs {
		if r.Name == framepackv1.Stage_STAGE_TRANSFORMER.String() && r.Section == 0 && count[r.Name] > total {
			t.Errorf("section 0 sampled again: %v", count)
		}
	}
	hist, err := os.ReadDir(filepath.Join(o.State, "jobs", id, "history"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range hist {
		names = append(names, e.Name())
	}
	if slices.Contains(names, pipeline.SectionFile(0)) || !slices.Contains(names, pipeline.SectionFile(total-1)) {
		t.Errorf("history files %v: want only the newest section's", names)
	}
	if p := partials(filepath.Join(o.State, "jobs", id)); len(p) > 0 {
		t.Errorf("partial files left: %v", p)
	}
	if err := proc.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := proc.Wait(); err != nil {
		t.Errorf("daemon stop: %v", err)
	}
	if err := waitNoWorkers(workers, 5*time.Second); err != nil {
		t.Error(err)
	}
	if err := shmEmpty(o.Shm); err != nil {
		t.Error(err)
	}
}

// TestCancelKillsWorker cancels a job while the transformer samples: the worker is killed, the
// job is CANCELLED, no partial file, no shared memory and no checkpoint are left.
func TestCancelKillsWorker(t *testing.T) {
	jc := firstCase(t)
	workers := buildWorkers(t)
	o := newOpts(t, workers)
	var stages stageLog
	o.onStage = stages.onStage
	d, err := newDaemon(o, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	ctx, cancel := context.WithTimeout(t.Context(), jobTimeout)
	defer cancel()
	c := client(t, o.Socket)
	resp, err := c.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: jc.image, Spec: jc.spec})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJob().GetId()
	last, err := watch(ctx, c, id, func(ev *framepackv1.JobEvent) bool {
		if s := ev.GetSamplingStep(); s != nil && s.GetStep() == 1 {
			if _, err := c.CancelJob(ctx, &framepackv1.CancelJobRequest{JobId: id, Reason: "test"}); err != nil {
				t.Errorf("cancel: %v", err)
			}
		}
		return true
	})
	if err != nil {
		t.Fatal(err)
	}
	if last.GetJobCancelled() == nil {
		t.Fatalf("job ended with %v", last)
	}
	// The runner stops on its own goroutine: the worker goes, then the arena.
	if err := waitNoWorkers(workers, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for shmEmpty(o.Shm) != nil && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if err := shmEmpty(o.Shm); err != nil {
		t.Fatal(err)
	}
	if p := partials(filepath.Join(o.State, "jobs", id)); len(p) > 0 {
		t.Errorf("partial files left: %v", p)
	}
	if cp, err := d.Store().Checkpoint(id); err != nil || cp != nil {
		t.Errorf("checkpoint %v (%v) after a cancel in section 0", cp, err)
	}
	job, err := c.GetJob(ctx, &framepackv1.GetJobRequest{JobId: id})
	if err != nil || job.GetJob().GetState() != framepackv1.JobState_JOB_STATE_CANCELLED {
		t.Fatalf("job %v (%v)", job.GetJob().GetState(), err)
	}
	if _, err := os.Stat(filepath.Join(o.State, "jobs", id, "history", pipeline.SectionFile(0))); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("section 0 history after a cancel in section 0: %v", err)
	}
}

// TestDrainResumes stops the daemon gracefully after the first section: the runner stops at
// the section boundary (or is cancelled when the grace runs out), the job stays queued, and a
// new daemon on the same state directory finishes it with the fixture's frames.
func TestDrainResumes(t *testing.T) {
	jc := firstCase(t)
	workers := buildWorkers(t)
	o := newOpts(t, workers)
	d, err := newDaemon(o, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), jobTimeout)
	defer cancel()
	c := client(t, o.Socket)
	resp, err := c.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: jc.image, Spec: jc.spec})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetJob().GetId()
	stopped := make(chan error, 1)
	_, _ = watch(ctx, c, id, func(ev *framepackv1.JobEvent) bool {
		if sv := ev.GetSectionVideo(); sv != nil && sv.GetSectionIndex() == 0 {
			go func() { stopped <- d.Stop(ctx) }()
			return false
		}
		return true
	})
	if err := <-stopped; err != nil {
		t.Fatalf("stop: %v", err)
	}
	if err := waitNoWorkers(workers, 5*time.Second); err != nil {
		t.Fatalf("after a graceful stop: %v", err)
	}
	if err := shmEmpty(o.Shm); err != nil {
		t.Fatal(err)
	}
	// The checkpoint names the job's variant; one from before variants were recorded (none
	// named) must resume as i2v, so the restart below runs on such a checkpoint.
	forgetVariant(t, o.State, id, pipeline.VariantI2V)

	d, err = newDaemon(o, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	c = client(t, o.Socket)
	last, err := watch(ctx, c, id, nil)
	if err != nil {
		t.Fatal(err)
	}
	if last.GetJobFinished() == nil {
		t.Fatalf("job ended with %v", last)
	}
	got, err := c.GetJob(ctx, &framepackv1.GetJobRequest{JobId: id})
	if err != nil {
		t.Fatal(err)
	}
	recs := stageRecords(t, o.State, id)
	if n := len(slices.DeleteFunc(slices.Clone(recs), func(r pipeline.StageRecord) bool { return r.Name != framepackv1.Stage_STAGE_TEXT_ENCODE.String() })); n != 1 {
		t.Errorf("text encoder ran %d times", n)
	}
	checkOutputs(t, jc, o.State, got.GetJob(), int(got.GetJob().GetProgress().GetTotalSections()))
}

// TestJobOptions runs a one-section job with the options the fixture does not use: real CFG
// with a negative prompt and rescale, TeaCache, no previews, residency, and
// gpu_memory_preservation_gb on a lane of known device memory; it must finish with the
// section's frames, every worker must have run under the cap the preservation gives (as the
// workers' Stats report it), and nothing may be left behind. A preservation that leaves no
// memory fails the job, saying so.
func TestJobOptions(t *testing.T) {
	jc := firstCase(t)
	spec := proto.Clone(jc.spec).(*framepackv1.JobSpec)
	spec.TotalSecondLength = 0.4 // one section of the window
	spec.Cfg, spec.Rs, spec.NegativePrompt, spec.UseTeacache = 2, 0.5, "blurry", proto.Bool(true)
	spec.GpuMemoryPreservationGb = proto.Float32(2.5)
	jc.spec = spec
	workers := buildWorkers(t)
	o := newOpts(t, workers)
	o.NoPreviews, o.Residency = true, true
	o.DeviceMemory = 64 << 30
	wantCap := uint64(64<<30) - uint64(2.5*(1<<30)) - lanes.DefaultReserve
	d, err := newDaemon(o, testLogger())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Kill()
	job, evs := runJob(t, jc, o.Socket)
	if n := job.GetProgress().GetTotalSections(); n != 1 {
		t.Fatalf("%d sections", n)
	}
	for _, ev := range evs {
		if ev.GetPreview() != nil {
			t.Fatal("preview sent with previews off")
		}
	}
	// One section that is also the last: the window's frames plus the start frame.
	if got, want := job.GetResult().GetFrameCount(), uint32(4*(jc.window+1)-3); got != want {
		t.Errorf("%d frames, want %d", got, want)
	}
	workerStages, vaeStages := 0, 0
	var prev pipeline.StageRecord
	for _, r := range stageRecords(t, o.State, job.GetId()) {
		if r.Start.IsZero() || r.Start.Before(prev.Start.Add(prev.Wall)) {
			t.Errorf("stage %s starts at %v, before the stage before it (%s, %v + %v) ended", r.Name, r.Start, prev.Name, prev.Start, prev.Wall)
		}
		prev = r
		if r.Worker == "" {
			continue
		}
		workerStages++
		// each worker runs under the cap the lane gave it, within the job's budget
		if r.MemoryCapBytes == 0 || r.MemoryCapBytes != r.CapBytes || r.CapBytes > wantCap {
			t.Errorf("stage %s ran under a cap of %d bytes, the lane gave %d; want that cap, within the budget %d (64 GiB − 2.5 GiB preserved − the reserve)",
				r.Name, r.MemoryCapBytes, r.CapBytes, wantCap)
		}
		// what the e2e benchmark reads: the loaded bytes (load GB/s) and the transformer's residency
		if !r.Reused && r.WeightBytes == 0 {
			t.Errorf("stage %s loaded its worker but records no weight bytes", r.Name)
		}
		if r.Worker == "transformer" && !r.Reused && r.ResidentBlocks+r.StreamedBlocks == 0 {
			t.Errorf("stage %s records no transformer blocks (resident %d, streamed %d)", r.Name, r.ResidentBlocks, r.StreamedBlocks)
		}
		// the VAE stages leave the tiling to the worker: with room to spare, no spatial tiles
		vae := r.Name == framepackv1.Stage_STAGE_VAE_ENCODE.String() || r.Name == framepackv1.Stage_STAGE_VAE_DECODE.String()
		if vae {
			vaeStages++
		}
		if vae && (!r.VAETileChosen || r.VAETilePx != 0) {
			t.Errorf("stage %s: tiling chosen %v, tile %d px; want chosen by the worker, untiled", r.Name, r.VAETileChosen, r.VAETilePx)
		}
	}
	if workerStages < 5 || vaeStages < 2 {
		t.Errorf("%d worker stages recorded, %d of the vae", workerStages, vaeStages)
	}

	// 63.5 GiB preserved of 64 leaves nothing once the reserve is kept back.
	spec = proto.Clone(spec).(*framepackv1.JobSpec)
	spec.GpuMemoryPreservationGb = proto.Float32(63.5)
	ctx, cancel := context.WithTimeout(t.Context(), jobTimeout)
	defer cancel()
	c := client(t, o.Socket)
	resp, err := c.SubmitJob(ctx, &framepackv1.SubmitJobRequest{Image: jc.image, Spec: spec})
	if err != nil {
		t.Fatal(err)
	}
	last, err := watch(ctx, c, resp.GetJob().GetId(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if f := last.GetJobFailed(); f == nil || !strings.Contains(f.GetFailure().GetMessage(), "no device memory left") {
		t.Errorf("a job preserving 63.5 of 64 GiB ended with %v", last)
	}
	if err := waitNoWorkers(workers, 5*time.Second); err != nil {
		t.Error(err)
	}
	if err := shmEmpty(o.Shm); err != nil {
		t.Error(err)
	}
}

// forgetVariant checks that job id's checkpoint records the variant want, then saves it again
// without a variant, as checkpoints were written before variants existed.
func forgetVariant(t *testing.T, state, id, want string) {
	t.Helper()
	st, err := jobs.Open(state)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cp, err := st.Checkpoint(id)
	if err != nil || cp == nil {
		t.Fatalf("checkpoint %v (%v)", cp, err)
	}
	if cp.Variant != want {
		t.Fatalf("checkpoint variant %q, want %q", cp.Variant, want)
	}
	cp.Variant = ""
	if err := st.SaveCheckpoint(id, *cp); err != nil {
		t.Fatal(err)
	}
}
