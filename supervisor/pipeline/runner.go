// Package pipeline is the FramePack image-to-video job as a jobs.Runner: the section loop of
// FramePack's demo_gradio.py `worker`, with every model in a worker process of its own that a
// lane (supervisor/lanes) starts, loads, runs and kills for each stage.
//
// A job runs, in order: the text encoder (LLaMA + CLIP-L; zero negative at cfg 1); the
// preparation of the start frame in the supervisor (nearest bucket, LANCZOS resize-to-cover
// with a centre crop, [-1, 1]); the VAE encoder (start latent = posterior mean ×
// scaling_factor: the reference samples the posterior, but its spread is negligible for the
// real VAE and the parity fixture uses the mean); the SigLIP image encoder; then the sections,
// generated backwards in time: the transformer samples one window from clean latents taken
// from the history, the VAE decodes the newest latents, the pixels are soft-blended into the
// history, and an MP4 of the video so far is written. One torch generator serves the whole
// job: its state travels through each transformer request and result.
//
// Tensors travel between the supervisor and the workers only through the job's shared-memory
// arena (internal/shm), removed when the job ends. On disk, the job directory holds the input,
// the spec, history/conditioning.safetensors (the encoders' outputs), after every section
// history/section-NNN.safetensors (history latents, history pixels, generator state; only the
// newest is kept unless Config.KeepSectionHistory), the section MP4s under video/, and
// history/stages.jsonl (what every stage cost). A restarted job resumes after its last
// checkpointed section and produces the same frames as an uninterrupted run.
package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"github.com/framepackd/framepackd/supervisor/video"
	"github.com/framepackd/framepackd/supervisor/watchdog"
)

// Config holds a Runner's dependencies. The function fields are what tests replace.
type Config struct {
	// Models are the model folders (ResolveModels); required.
	Models Models
	// Lane returns the lane a job runs on, by the name the queue gave it; required.
	Lane func(name string) (*lanes.Lane, error)
	// Shm is the shared-memory root the job arenas live in; required.
	Shm *shm.Root
	// Video writes the section videos; nil means a zero video.Writer (ffmpeg from PATH).
	Video *video.Writer
	// MaxImagePixels bounds the decoded start and end images, width × height: the daemon's
	// --max-image-pixels, which the API checks at submit; 0 means plan.DefaultMaxImagePixels.
	MaxImagePixels int64
	// NoPreviews turns off the per-step preview tensors and Preview events.
	NoPreviews bool
	// VAETiling forces the VAE's tiling; nil lets the VAE worker choose it from its memory cap
	// (framewise in time, spatial tiles only as small as the cap needs).
	VAETiling *workerkit.VAETiling
	// SiglipProcessor is the clipvision worker's SiglipImageProcessor ("pil" for transformers
	// 4's; "" transformers 5's torchvision, the default): LoadRequest.siglip_processor.
	SiglipProcessor string
	// KeepSectionHistory keeps every section's history file instead of only the newest.
	KeepSectionHistory bool
	// KeepSectionVideos keeps every section's MP4; by default a section's MP4 is removed once
	// the next one (which holds all its frames) is written.
	KeepSectionVideos bool
	// FreeBytes returns the free bytes of the file system holding dir; before a section's
	// files are written the job fails (ErrDiskFull) when they would not fit. Nil skips the
	// check (the writes still fail cleanly on a full disk).
	FreeBytes func(dir string) (uint64, error)
	// Residency lets workers stay alive between stages where the lane's budget proves they fit
	// beside the next (see residency.go and supervisor/lanes); off: every worker is killed after
	// its stage.
	Residency bool
	// KeepAlive is how long a job's workers stay alive after it when its spec does not say
	// (JobSpec.keep_alive); lanes.KeepAliveAuto is the lane's default (its Config.KeepAlive
	// where the job's workers all fitted, else 0).
	KeepAlive time.Duration
	// OnStage receives every stage's record when it ends (benchmarks, tests).
	OnStage func(StageRecord)
	// Watchdog returns the watchdog of a lane (supervisor/watchdog; see watchdog.go): every
	// worker stage then runs under it, with hang detection, recovery checks and retries down
	// the degradation ladder. Nil (or a nil result) runs each stage once.
	Watchdog func(lane string) *watchdog.Watchdog
	// Log is the runner's logger; nil means the standard logger.
	Log logrus.FieldLogger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Runner runs FramePack jobs; it implements jobs.Runner.
type Runner struct {
	cfg Config
	log logrus.FieldLogger
	// rests is what the lanes' last jobs measured of a section besides sampling (eta.go).
	rests restMemo
}

var _ jobs.Runner = (*Runner)(nil)

// New checks the configuration and the model folders and returns a Runner.
func New(cfg Config) (*Runner, error) {
	if cfg.Lane == nil || cfg.Shm == nil {
		return nil, errors.New("new pipeline: Lane and Shm are required")
	}
	if cfg.Models.HunyuanVideo == "" || cfg.Models.FluxRedux == "" || cfg.Models.Transformer == "" {
		return nil, errors.New("new pipeline: every model folder is required (see ResolveModels)")
	}
	if cfg.Video == nil {
		cfg.Video = &video.Writer{}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxImagePixels <= 0 {
		cfg.MaxImagePixels = plan.DefaultMaxImagePixels
	}
	log := cfg.Log
	if log == nil {
		log = logrus.StandardLogger()
	}
	return &Runner{cfg: cfg, log: log}, nil
}

// CheckVariant says whether a job of the named sampling variant can run here: the variant is
// known and its transformer was found. The API calls it at submit.
func (r *Runner) CheckVariant(name string) error {
	if name == VariantVideo || name == VariantVideoF1 {
		return fmt.Errorf("variant %q is what a job that extends a video runs: give the video (input_video) with variant i2v or f1", name)
	}
	v, err := variantByName(name)
	if err != nil {
		return err
	}
	if r.transformerDir(v.Name()) == "" {
		return fmt.Errorf("variant %s needs the FramePack-F1 transformer (%s), which is not in the models folder: download it next to the others and restart the daemon",
			v.Name(), transformerF1Layout.repo)
	}
	return nil
}

// transformerDir is the transformer folder a variant samples with ("" when not installed).
func (r *Runner) transformerDir(variant string) string {
	if variantTransformer(variant) == VariantF1 {
		return r.cfg.Models.TransformerF1
	}
	return r.cfg.Models.Transformer
}

// StageRecord is what one stage of a job did and cost.
type StageRecord struct {
	Job     string            `json:"job"`
	Stage   framepackv1.Stage `json:"-"`
	Name    string            `json:"stage"`
	Section int               `json:"section"` // -1 for once-per-job stages
	Lane    string            `json:"lane"`
	Worker  string            `json:"worker,omitempty"` // empty for supervisor-side stages
	PID     int               `json:"pid,omitempty"`
	Reused  bool              `json:"reused,omitempty"`
	Kept    bool              `json:"kept,omitempty"`
	// CapBytes is the memory cap the lane gave the worker and Residency why, and why it was
	// kept or killed (lanes.Report.Decision); Evicted are the kept workers killed to make room.
	CapBytes  uint64   `json:"cap_bytes,omitempty"`
	Residency string   `json:"residency,omitempty"`
	Evicted   []string `json:"evicted,omitempty"`
	// Start is when the stage began (its worker's spawn; benchmarks match device memory
	// samples to stages by it).
	Start time.Time `json:"start"`
	// Wall is the whole stage, spawn to reaped worker.
	Wall         time.Duration `json:"wall_ns"`
	SpawnToReady time.Duration `json:"spawn_to_ready_ns"`
	Load         time.Duration `json:"load_ns"`
	Compute      time.Duration `json:"compute_ns"`
	Teardown     time.Duration `json:"teardown_ns"`
	// AllocPeakBytes is the worker allocator's peak; RSSPeakBytes the worker's peak RSS.
	AllocPeakBytes uint64 `json:"alloc_peak_bytes,omitempty"`
	// MemoryCapBytes is the cap the worker ran under, as its Stats reported it.
	MemoryCapBytes uint64 `json:"memory_cap_bytes,omitempty"`
	RSSPeakBytes   uint64 `json:"rss_peak_bytes,omitempty"`
	// VAETilePx is the spatial tile a VAE stage ran with (0: none) and VAETileChosen whether
	// the worker chose it from its cap (the request stated none).
	VAETilePx     uint32 `json:"vae_tile_px,omitempty"`
	VAETileChosen bool   `json:"vae_tile_chosen,omitempty"`
	// WeightBytes is the size of the weights the worker loaded (its LoadResponse's; 0 when
	// Reused): with Load, the load's bytes per second.
	WeightBytes uint64 `json:"weight_bytes,omitempty"`
	// ResidentBlocks and StreamedBlocks are the blocks (transformer) or layers (text encoder)
	// the worker kept on the device and streamed from host memory.
	ResidentBlocks uint32 `json:"resident_blocks,omitempty"`
	StreamedBlocks uint32 `json:"streamed_blocks,omitempty"`
	// CacheSkippedSteps are the sampling steps (0-based) TeaCache or MagCache skipped
	// (transformer stages).
	CacheSkippedSteps []uint32 `json:"cache_skipped_steps,omitempty"`
	// Err is the failure, empty on success.
	Err string `json:"error,omitempty"`
	// ConvTiers are the worker's convolution tier counts (metrics).
	ConvTiers []workerkit.ConvTierStats `json:"-"`
	// Cancelled says the stage stopped because the job was cancelled or the daemon is
	// stopping: not a failure (logged at info).
	Cancelled bool `json:"cancelled,omitempty"`
}

// Run runs one job; see jobs.Runner for the contract.
func (r *Runner) Run(ctx context.Context, job *jobs.Job, emit func(*framepackv1.JobEvent)) (jobs.Result, error) {
	lane, err := r.cfg.Lane(job.Lane)
	if err != nil {
		return jobs.Result{}, &jobs.FailureError{Failure: &framepackv1.JobFailure{Message: fmt.Sprintf("lane %q: %v", job.Lane, err)}}
	}
	j, err := r.newJobRun(job, lane, emit)
	if err != nil {
		return jobs.Result{}, &jobs.FailureError{Failure: &framepackv1.JobFailure{Message: err.Error()}}
	}
	arena, err := r.cfg.Shm.NewArena(job.ID)
	if err != nil {
		return jobs.Result{}, fmt.Errorf("job %s: shared memory: %w", job.ID, err)
	}
	j.arena = arena
	if r.cfg.Watchdog != nil {
		if wd := r.cfg.Watchdog(job.Lane); wd != nil {
			j.wd = wd.Job(job.ID, func(r watchdog.Retry) { j.emit(retryEvent(job.ID, r)) })
		}
	}
	defer func() {
		lane.Release(job.ID, j.keepAlive())
		if err := arena.Close(); err != nil {
			j.log.WithError(err).Warn("remove shared-memory arena")
		}
	}()
	return j.run(ctx)
}

// jobRun is one run of one job.
type jobRun struct {
	r     *Runner
	job   *jobs.Job
	lane  *lanes.Lane
	arena *shm.Arena
	emitf func(*framepackv1.JobEvent)
	log   logrus.FieldLogger

	window, steps, total int
	buckets              []imageproc.Bucket
	// variant is the job's sampling variant (variant.go); a resumed job keeps its checkpoint's.
	variant Variant
	// lorasApplied is what the transformer last reported merging (metadata.go).
	lorasApplied []workerkit.LoraApplied
	// weightsFormat and fp8Compute are the transformer's 8-bit weights as it last reported them
	// (empty: none).
	weightsFormat, fp8Compute string
	// memCap is the memory cap of every worker of the job (lanes.Lane.MemoryCap; 0: none).
	memCap uint64
	// preserve is the job's gpu_memory_preservation_gb in bytes, the default filled in.
	preserve uint64

	cond *conditioning
	hist *history
	eta  etaModel

	// section0 is the section loop's residency plan, made before this run's first section
	// (residency.go).
	section0 *sectionPlan

	wd *watchdog.Job // the job's retries under the lane's watchdog; nil without one
	// attempt is the attempt of the stage running now (1, then the watchdog's retries); only
	// the section loop's goroutine touches it.
	attempt int
}

func (r *Runner) newJobRun(job *jobs.Job, lane *lanes.Lane, emit func(*framepackv1.JobEvent)) (*jobRun, error) {
	spec := job.Spec
	if spec == nil {
		return nil, errors.New("job has no spec")
	}
	buckets, err := plan.Buckets(spec)
	if err != nil {
		return nil, err
	}
	if err := plan.CheckRun(spec); err != nil {
		return nil, err
	}
	w, steps := int(spec.GetLatentWindowSize()), int(spec.GetSteps())
	total := job.TotalSections
	if total < 1 {
		total = plan.TotalSections(spec)
	}
	variant, err := variantByName(jobVariant(spec))
	if err != nil {
		return nil, err
	}
	// Every worker of the job runs under the lane's cap less the job's preservation
	// (FramePack's "GPU inference preserved memory", in GiB as torch counts it; the API filled
	// in its default).
	preserve := float64(spec.GetGpuMemoryPreservationGb())
	memCap, err := lane.MemoryCap(uint64(preserve * (1 << 30)))
	if err != nil {
		return nil, fmt.Errorf("gpu_memory_preservation_gb %g: %w", preserve, err)
	}
	j := &jobRun{r: r, job: job, lane: lane, emitf: emit,
		log:    r.log.WithFields(logrus.Fields{"job": job.ID, "lane": job.Lane}),
		window: w, steps: steps, total: total, buckets: buckets, variant: variant, memCap: memCap,
		preserve: uint64(max(preserve, 0) * (1 << 30))}
	j.eta = etaModel{steps: steps, sections: total}
	return j, nil
}

func (j *jobRun) emit(ev *framepackv1.JobEvent) {
	if j.emitf != nil {
		j.emitf(ev)
	}
}

func (j *jobRun) draining() bool {
	if j.job.Draining == nil {
		return false
	}
	select {
	case <-j.job.Draining:
		return true
	default:
		return false
	}
}

// run runs the job from scratch or from its checkpoint.
func (j *jobRun) run(ctx context.Context) (jobs.Result, error) {
	if err := os.MkdirAll(j.job.Dir.History(), 0o755); err != nil {
		return jobs.Result{}, fmt.Errorf("job %s: %w", j.job.ID, err)
	}
	if err := os.MkdirAll(j.job.Dir.Videos(), 0o755); err != nil {
		return jobs.Result{}, fmt.Errorf("job %s: %w", j.job.ID, err)
	}
	start := 0
	if cp := j.job.Resume; cp != nil {
		res, next, done, err := j.resume(cp)
		switch {
		case err != nil:
			j.log.WithError(err).Warn("checkpoint unusable; starting the job from scratch")
		case done:
			return res, nil
		default:
			start = next
			if j.hist.pixels == nil {
				if err := j.restorePending(ctx); err != nil {
					return jobs.Result{}, err
				}
			}
		}
	}
	if start == 0 {
		j.hist = nil
		if err := j.encode(ctx); err != nil {
			return jobs.Result{}, err
		}
	}
	if err := j.bindVideo(); err != nil {
		return jobs.Result{}, &jobs.FailureError{Failure: &framepackv1.JobFailure{Message: err.Error()}}
	}
	if j.hist == nil {
		latents, generated, err := j.variant.InitialHistory(j.cond.startLatent, j.cond.endFrame())
		if err != nil {
			return jobs.Result{}, j.failure(ctx, framepackv1.Stage_STAGE_TRANSFORMER, 0, j.r.cfg.Now(), 0, fmt.Errorf("history: %w", err))
		}
		j.hist = &history{section: -1, latents: latents, totalGenerated: generated}
	}
	condSeg, err := j.arena.NewSegment("cond")
	if err != nil {
		return jobs.Result{}, fmt.Errorf("job %s: %w", j.job.ID, err)
	}
	if _, err := shm.WriteSegment(condSeg, j.cond.transformerTensors()); err != nil {
		return jobs.Result{}, fmt.Errorf("job %s: conditioning segment: %w", j.job.ID, err)
	}
	j.eta.setPrior(j.r.rests.get(j.restKey()))
	var res jobs.Result
	for i := start; i < j.total; i++ {
		if i > start && j.draining() {
			j.log.WithField("next_section", i).Info("daemon draining: stopping after the checkpointed section")
			return jobs.Result{}, jobs.ErrInterrupted
		}
		if res, err = j.section(ctx, i, condSeg); err != nil {
			return jobs.Result{}, err
		}
	}
	return res, nil
}

// resume loads the checkpoint's files. done is true when the checkpoint is the last section.
func (j *jobRun) resume(cp *jobs.Checkpoint) (res jobs.Result, next int, done bool, err error) {
	variant, err := variantByName(cp.Variant) // "" is a checkpoint from before variants: i2v
	if err != nil {
		return res, 0, false, fmt.Errorf("checkpoint: %w", err)
	}
	if cp.Sections != j.total {
		return res, 0, false, fmt.Errorf("checkpoint has %d sections, the job %d", cp.Sections, j.total)
	}
	if cp.Section+1 >= j.total {
		if _, err := os.Stat(cp.VideoPath); err != nil {
			return res, 0, false, fmt.Errorf("final video: %w", err)
		}
		return jobs.Result{VideoPath: cp.VideoPath, FrameCount: cp.FrameCount, PNGFrames: filepath.Ext(cp.VideoPath) == video.FramesDirExt}, 0, true, nil
	}
	dir := j.job.Dir.Path()
	cond, err := loadConditioning(filepath.Join(dir, cp.Files[cpConditioning]))
	if err != nil {
		return res, 0, false, err
	}
	hist, err := loadHistory(filepath.Join(dir, cp.Files[cpSection]))
	if err != nil {
		return res, 0, false, err
	}
	if hist.section != cp.Section {
		return res, 0, false, fmt.Errorf("history file holds section %d, the checkpoint says %d", hist.section, cp.Section)
	}
	if hist.latents.H != cond.startLatent.H || hist.latents.W != cond.startLatent.W {
		return res, 0, false, fmt.Errorf("history latents %v do not match the start latent %v", hist.latents.Shape(), cond.startLatent.Shape())
	}
	if variant.Name() != j.variant.Name() {
		j.log.WithFields(logrus.Fields{"checkpoint": variant.Name(), "spec": j.variant.Name()}).Warn("resuming with the checkpoint's sampling variant")
	}
	j.cond, j.hist, j.variant = cond, hist, variant
	if hist.segments == nil && hist.pixels != nil && hist.pixels.T > 0 {
		// A checkpoint from before segments: its history holds every frame, which the videos
		// so far were each written from whole. The frames no later section touches become the
		// first segment, the rest stays to be blended, as if the job had been written this way.
		if err := j.legacySegment(hist); err != nil {
			return res, 0, false, fmt.Errorf("checkpoint without segments: %w", err)
		}
	}
	j.log.WithFields(logrus.Fields{"after_section": cp.Section, "sections": j.total, "variant": variant.Name()}).Info("resuming job")
	return res, cp.Section + 1, false, nil
}

// keepAlive is how long the job's workers stay alive after it: the spec's keep_alive, else the
// runner's default.
func (j *jobRun) keepAlive() time.Duration {
	if ka := j.job.Spec.GetKeepAlive(); ka != nil {
		return max(ka.AsDuration(), 0)
	}
	return j.r.cfg.KeepAlive
}

// stageEvent is a StageStarted or StageFinished event.
// Every attempt of a stage starts with its own StageStarted (attempt 1, then each retry the
// watchdog makes, see runOnLane); StageFinished carries the attempt that succeeded.
func (j *jobRun) stageStarted(stage framepackv1.Stage, section int) {
	j.attempt = 1
	j.stageAttemptStarted(stage, section, 1)
}

func (j *jobRun) stageAttemptStarted(stage framepackv1.Stage, section, attempt int) {
	j.emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageStarted{StageStarted: &framepackv1.StageStarted{
		Stage: stage, SectionIndex: uint32(max(section, 0)), Attempt: uint32(attempt), Lane: j.job.Lane}}})
}

func (j *jobRun) stageFinished(stage framepackv1.Stage, section int, wall, load, compute time.Duration, loras ...workerkit.LoraApplied) {
	j.emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageFinished{StageFinished: &framepackv1.StageFinished{
		Stage: stage, SectionIndex: uint32(max(section, 0)), Attempt: uint32(max(j.attempt, 1)), Duration: durationpb.New(wall),
		LoadDuration: durationpb.New(load), ComputeDuration: durationpb.New(compute), Loras: lorasApplied(loras)}}})
}

// loadedLoras is what the worker of a stage reported merging when it loaded (nil: none).
func loadedLoras(rep lanes.Report) []workerkit.LoraApplied {
	if rep.Loaded == nil {
		return nil
	}
	return rep.Loaded.Loras
}

// jobLoras is the spec's LoRAs as the transformer's LoadRequest takes them.
func jobLoras(spec *framepackv1.JobSpec) []workerkit.LoraSpec {
	var out []workerkit.LoraSpec
	for _, l := range spec.GetLoras() {
		out = append(out, workerkit.LoraSpec{Path: l.GetPath(), Strength: float64(l.GetStrength())})
	}
	return out
}

// lorasApplied is what the transformer worker reports having merged, as events carry it.
func lorasApplied(ls []workerkit.LoraApplied) []*framepackv1.LoraApplied {
	var out []*framepackv1.LoraApplied
	for _, l := range ls {
		out = append(out, &framepackv1.LoraApplied{Path: l.Path, Strength: float32(l.Strength), Format: l.Format, WeightsChanged: l.WeightsChanged})
	}
	return out
}

// record logs a stage's record, appends it to the job's stages file and hands it to OnStage.
func (j *jobRun) record(rec StageRecord) {
	rec.Job, rec.Lane, rec.Name = j.job.ID, j.job.Lane, rec.Stage.String()
	f := j.log.WithFields(logrus.Fields{"stage": rec.Name, "section": rec.Section, "wall": rec.Wall.Round(time.Microsecond).String()})
	if rec.Worker != "" {
		f = f.WithFields(logrus.Fields{"worker": rec.Worker, "pid": rec.PID, "spawn_to_ready": rec.SpawnToReady.Round(time.Microsecond).String(),
			"load": rec.Load.Round(time.Microsecond).String(), "compute": rec.Compute.Round(time.Microsecond).String(),
			"teardown": rec.Teardown.Round(time.Microsecond).String(), "alloc_peak": rec.AllocPeakBytes, "rss_peak": rec.RSSPeakBytes,
			"cap": rec.CapBytes, "residency": rec.Residency})
	}
	switch {
	case rec.Cancelled:
		f.WithField("reason", rec.Err).Info("stage cancelled")
	case rec.Err != "":
		f.WithField("error", rec.Err).Warn("stage failed")
	default:
		f.Info("stage done")
	}
	if line, err := json.Marshal(rec); err == nil {
		if fh, err := os.OpenFile(filepath.Join(j.job.Dir.History(), StagesFile), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644); err == nil {
			_, _ = fh.Write(append(line, '\n'))
			_ = fh.Close()
		}
	}
	if j.r.cfg.OnStage != nil {
		j.r.cfg.OnStage(rec)
	}
}

// workerStage runs one model stage on the lane with its events and records.
func (j *jobRun) workerStage(ctx context.Context, stage framepackv1.Stage, section int, st lanes.Stage) (lanes.Report, error) {
	st.JobID, st.MemoryCap = j.job.ID, j.memCap
	if st.OnEvent == nil {
		st.OnEvent = j.workerEvent(stage)
	}
	st.OnTelemetry = j.telemetry(stage)
	j.stageStarted(stage, section)
	t0 := time.Now()
	rep, err := j.runOnLane(ctx, stage, section, st) // watchdog.go
	wall := time.Since(t0)
	rec := StageRecord{Stage: stage, Section: section, Worker: string(st.Model), PID: rep.PID, Reused: rep.Reused, Kept: rep.Kept,
		Start: t0, Wall: wall, SpawnToReady: rep.SpawnToReady, Load: rep.Load, Compute: rep.Compute, Teardown: rep.Teardown,
		AllocPeakBytes: rep.AllocPeakBytes, RSSPeakBytes: rep.RSSPeakBytes, ConvTiers: rep.ConvTiers,
		MemoryCapBytes: rep.MemoryCapBytes, ResidentBlocks: rep.ResidentBlocks, StreamedBlocks: rep.StreamedBlocks,
		CapBytes: rep.CapBytes, Residency: rep.Decision}
	for _, m := range rep.Evicted {
		rec.Evicted = append(rec.Evicted, string(m))
	}
	if !rep.Reused {
		rec.WeightBytes = rep.WeightBytes
	}
	if rep.Result != nil {
		rec.CacheSkippedSteps = rep.Result.CacheSkippedSteps
	}
	if rep.Result != nil && rep.Result.VAETiling != nil {
		vt := rep.Result.VAETiling
		rec.VAETileChosen = vt.Chosen
		if vt.Tiling.EnableSpatialTiling {
			rec.VAETilePx = min(vt.Tiling.TileSampleMinHeight, vt.Tiling.TileSampleMinWidth) // a strip: its narrow side
		}
	}
	if err != nil {
		rec.Err, rec.Cancelled = err.Error(), ctx.Err() != nil
		j.record(rec)
		return rep, j.failure(ctx, stage, section, t0, wall, err)
	}
	j.record(rec)
	j.stageFinished(stage, section, wall, rep.Load, rep.Compute, loadedLoras(rep)...)
	return rep, nil
}

// hostStage runs a supervisor-side stage with its events and record.
func (j *jobRun) hostStage(ctx context.Context, stage framepackv1.Stage, section int, fn func() error) error {
	j.stageStarted(stage, section)
	t0 := time.Now()
	err := fn()
	wall := time.Since(t0)
	rec := StageRecord{Stage: stage, Section: section, Start: t0, Wall: wall, Compute: wall}
	if err != nil {
		rec.Err, rec.Cancelled = err.Error(), ctx.Err() != nil
		j.record(rec)
		return j.failure(ctx, stage, section, t0, wall, err)
	}
	j.record(rec)
	j.stageFinished(stage, section, wall, 0, wall)
	return nil
}

// failure turns a stage error into what Run returns: the cancellation as it is, anything else
// as a FailureError with the failed attempt.
func (j *jobRun) failure(ctx context.Context, stage framepackv1.Stage, section int, start time.Time, wall time.Duration, err error) error {
	msg := fmt.Sprintf("%s: %v", stageName(stage, section), err)
	if ctx.Err() != nil {
		return fmt.Errorf("%s: %w", msg, context.Cause(ctx))
	}
	var giveUp *watchdog.GiveUpError
	if errors.As(err, &giveUp) {
		return &jobs.FailureError{Failure: giveUp.Failure()} // every attempt of the job, from the watchdog
	}
	sec := uint32(max(section, 0))
	return &jobs.FailureError{Failure: &framepackv1.JobFailure{
		Message: msg, Stage: stage, SectionIndex: sec,
		Attempts: []*framepackv1.Attempt{{Stage: stage, SectionIndex: sec, Attempt: 1, Class: classOf(err), Message: err.Error(),
			Lane: j.job.Lane, StartTime: timestamppb.New(start), Duration: durationpb.New(wall)}},
	}}
}

func stageName(stage framepackv1.Stage, section int) string {
	name := map[framepackv1.Stage]string{
		framepackv1.Stage_STAGE_TEXT_ENCODE: "text encode", framepackv1.Stage_STAGE_PREPARE: "prepare",
		framepackv1.Stage_STAGE_VAE_ENCODE: "vae encode", framepackv1.Stage_STAGE_IMAGE_ENCODE: "image encode",
		framepackv1.Stage_STAGE_TRANSFORMER: "transformer", framepackv1.Stage_STAGE_VAE_DECODE: "vae decode",
		framepackv1.Stage_STAGE_WRITE_VIDEO: "write video",
	}[stage]
	if section >= 0 {
		// Users count sections from 1, as the CLI's "section 2/5" does.
		return fmt.Sprintf("%s (section %d)", name, section+1)
	}
	return name
}

// classOf classifies a stage error for the job's failure story.
func classOf(err error) framepackv1.AttemptClass {
	var exit *workerkit.ExitError
	if errors.As(err, &exit) {
		return framepackv1.AttemptClass_ATTEMPT_CLASS_CRASH
	}
	switch workerkit.CodeOf(err) {
	case workerkit.CodeOutOfMemory:
		return framepackv1.AttemptClass_ATTEMPT_CLASS_OOM
	case workerkit.CodeDeviceLost:
		return framepackv1.AttemptClass_ATTEMPT_CLASS_DEVICE_LOST
	case workerkit.CodeInvalidArgument:
		return framepackv1.AttemptClass_ATTEMPT_CLASS_BAD_INPUT
	}
	if errors.Is(err, errBadInput) {
		return framepackv1.AttemptClass_ATTEMPT_CLASS_BAD_INPUT
	}
	return framepackv1.AttemptClass_ATTEMPT_CLASS_CRASH
}

// errBadInput marks a supervisor-side failure caused by the job's input.
var errBadInput = errors.New("bad input")

// workerEvent handles the events of a stage other than the transformer's: fallbacks become
// Fallback events, log lines go to the log.
func (j *jobRun) workerEvent(stage framepackv1.Stage) func(workerkit.Event) error {
	return func(e workerkit.Event) error {
		switch ev := e.(type) {
		case *workerkit.ConvFallback:
			j.emit(fallbackEvent(stage, ev))
		case *workerkit.LogLine:
			j.workerLog(stage, ev)
		}
		return nil
	}
}

func (j *jobRun) workerLog(stage framepackv1.Stage, ev *workerkit.LogLine) {
	f := j.log.WithField("stage", stage.String())
	for k, v := range ev.Fields {
		f = f.WithField(k, v)
	}
	switch ev.Level {
	case workerkit.LogError:
		f.Error(ev.Message)
	case workerkit.LogWarn:
		f.Warn(ev.Message)
	case workerkit.LogDebug:
		f.Debug(ev.Message)
	default:
		f.Info(ev.Message)
	}
}

func fallbackEvent(stage framepackv1.Stage, ev *workerkit.ConvFallback) *framepackv1.JobEvent {
	from := framepackv1.ConvTier(ev.Tier)
	to := framepackv1.ConvTier(min(int32(ev.Tier)+1, int32(framepackv1.ConvTier_CONV_TIER_CPU)))
	reason := map[workerkit.ConvOutcome]string{
		workerkit.ConvOutcomeFailed: "failed", workerkit.ConvOutcomeSkippedHung: "hung before",
		workerkit.ConvOutcomeUnavailable: "unavailable", workerkit.ConvOutcomeSucceeded: "succeeded",
	}[ev.Outcome]
	if ev.Detail != "" {
		reason += ": " + ev.Detail
	}
	return &framepackv1.JobEvent{Event: &framepackv1.JobEvent_Fallback{Fallback: &framepackv1.FallbackEvent{
		Stage: stage, ShapeKey: ev.ShapeKey, FromTier: from, ToTier: to, Reason: reason}}}
}

// telemetryEvery is the most often a stage sends MemoryTelemetry.
const telemetryEvery = time.Second

// telemetry returns the lane callback that turns memory samples into MemoryTelemetry events,
// at most one a second (and the stage's last).
func (j *jobRun) telemetry(stage framepackv1.Stage) func(lanes.Telemetry) {
	var mu sync.Mutex
	var last time.Time
	var peak uint64
	return func(t lanes.Telemetry) {
		mu.Lock()
		peak = max(peak, t.AllocatorPeakBytes)
		now := time.Now()
		send := t.Final || now.Sub(last) >= telemetryEvery
		if send {
			last = now
		}
		p := peak
		mu.Unlock()
		if !send {
			return
		}
		j.emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_MemoryTelemetry{MemoryTelemetry: &framepackv1.MemoryTelemetry{
			Stage: stage, Lane: j.job.Lane, WorkerAllocatorPeakBytes: p, WorkerRssBytes: t.RSSBytes}}})
	}
}

// segment reserves a segment name in the job's arena.
func (j *jobRun) segment(name string) (string, error) {
	p, err := j.arena.NewSegment(name)
	if err != nil {
		return "", fmt.Errorf("job %s: %w", j.job.ID, err)
	}
	return p, nil
}

// dropSegments removes the named segments, logging failures.
func (j *jobRun) dropSegments(names ...string) {
	for _, n := range names {
		if err := j.arena.Remove(n); err != nil {
			j.log.WithError(err).WithField("segment", n).Debug("remove segment")
		}
	}
}

// vaeTiling is the tiling the VAE stages ask for: the configured one, else none (the worker
// chooses from its memory cap; the watchdog's ladder states smaller tiles after an OOM).
func (j *jobRun) vaeTiling() *workerkit.VAETiling {
	if t := j.r.cfg.VAETiling; t != nil {
		c := *t
		return &c
	}
	return nil
}
