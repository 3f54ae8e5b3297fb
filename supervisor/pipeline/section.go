package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/lanes"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"github.com/framepackd/framepackd/supervisor/video"
)

// sectionPair is what alternates on the lane during the section loop; residency keeps both
// when they fit.
var sectionPair = []lanes.Model{lanes.Transformer, lanes.VAE}

// section runs section i: sample, decode, blend, write the MP4, checkpoint.
func (j *jobRun) section(ctx context.Context, i int, condSeg string) (jobs.Result, error) {
	sectionStart := time.Now()
	sec := Section{Index: i, Total: j.total, Window: j.window}
	hist := j.hist
	sfx := fmt.Sprintf("s%03d-", i)
	start := j.cond.startLatent

	// Clean latents 1x/2x/4x and the frame indices, as the job's variant takes them; a
	// keyframed section's start-side latent is its keyframe's (FramePack-eichi).
	sc, err := j.variant.Context(sec, j.cond.anchor(j.variant, sec), hist.latents)
	if err != nil {
		return jobs.Result{}, fmt.Errorf("section %d: %w", i, err)
	}
	idx := sc.Indices
	cleanSeg, err := j.segment(sfx + "clean")
	if err != nil {
		return jobs.Result{}, err
	}
	if _, err := shm.WriteSegment(cleanSeg, []safetensors.Tensor{f32Tensor("clean", sc.Clean), f32Tensor("clean_2x", sc.Clean2x),
		f32Tensor("clean_4x", sc.Clean4x)}); err != nil {
		return jobs.Result{}, fmt.Errorf("section %d: clean latents: %w", i, err)
	}
	latSeg, err := j.segment(sfx + "latents")
	if err != nil {
		return jobs.Result{}, err
	}
	var previews []workerkit.TensorRef
	segs := []string{sfx + "clean", sfx + "latents"}
	if !j.r.cfg.NoPreviews {
		for s := range j.steps {
			name := fmt.Sprintf("%spreview-%03d", sfx, s+1)
			p, err := j.segment(name)
			if err != nil {
				return jobs.Result{}, err
			}
			segs = append(segs, name)
			previews = append(previews, workerkit.TensorRef{Path: p, Name: "denoised"})
		}
	}
	defer func() { j.dropSegments(segs...) }()

	spec := j.job.Spec
	cref := func(name string) workerkit.TensorRef { return workerkit.TensorRef{Path: condSeg, Name: name} }
	prompts, err := j.jobPrompts()
	if err != nil {
		return jobs.Result{}, j.failure(ctx, framepackv1.Stage_STAGE_TRANSFORMER, i, sectionStart, 0, err)
	}
	k := prompts.section[i] // the prompt active at the section's start time
	req := &workerkit.TransformerSectionRequest{
		TransformerConditioning: workerkit.TransformerConditioning{
			TransformerText: workerkit.TransformerText{LlamaVec: cref(promptTensor(tLlamaVec, k)), LlamaMask: cref(promptTensor(tLlamaMask, k)), ClipPooler: cref(promptTensor(tClipPooler, k))},
			ImageEmbeddings: cref(tImageHidden),
			CleanLatents:    workerkit.TensorRef{Path: cleanSeg, Name: "clean"}, CleanLatentIndices: idx.Clean,
			CleanLatents2x: workerkit.TensorRef{Path: cleanSeg, Name: "clean_2x"}, CleanLatent2xIndices: idx.Clean2x,
			CleanLatents4x: workerkit.TensorRef{Path: cleanSeg, Name: "clean_4x"}, CleanLatent4xIndices: idx.Clean4x,
			LatentIndices: idx.Latent,
		},
		Negative: workerkit.TransformerText{LlamaVec: cref(tLlamaVecN), LlamaMask: cref(tLlamaMaskN), ClipPooler: cref(tClipPoolerN)},
		Steps:    uint32(j.steps), CFG: spec.GetCfg(), GS: spec.GetGs(), RS: spec.GetRs(),
		UseTeaCache: jobs.SpecCache(spec) == jobs.CacheTeaCache, MagCache: j.magCache(), Sampler: workerkit.SamplerUniPCBH1,
		GeneratorState: hist.generator, Seed: spec.GetSeed(),
		Width: uint32(j.cond.width), Height: uint32(j.cond.height), Frames: uint32(plan.Frames(j.window)),
		Latents:      workerkit.TensorRef{Path: latSeg, Name: "latents"},
		StepPreviews: previews,
	}
	steps := &stepTracker{j: j, section: i, last: time.Now()}
	rep, err := j.workerStage(ctx, framepackv1.Stage_STAGE_TRANSFORMER, i, lanes.Stage{
		Model: lanes.Transformer, ModelDir: j.r.transformerDir(j.variant.Name()), Request: req, KeepWith: j.keepWith(), Loras: jobLoras(spec),
		Workload: &workerkit.Workload{Height: uint32(j.cond.height), Width: uint32(j.cond.width), LatentWindowSize: uint32(j.window),
			ReserveBytes: j.reserveBytes()},
		OnEvent: steps.onEvent,
	})
	if err != nil {
		return jobs.Result{}, err
	}
	if l := loadedLoras(rep); len(l) > 0 {
		j.lorasApplied = l
	}
	j.logCacheSkips(i, rep.Result)
	generated, err := readSegmentVol(latSeg, "latents")
	if err == nil {
		err = checkTransformerFacts(rep.Loaded, generated)
	}
	if err != nil {
		return jobs.Result{}, j.failure(ctx, framepackv1.Stage_STAGE_TRANSFORMER, i, sectionStart, 0, err)
	}
	gen := rep.Result.GeneratorState
	if len(gen) == 0 {
		return jobs.Result{}, j.failure(ctx, framepackv1.Stage_STAGE_TRANSFORMER, i, sectionStart, 0, errors.New("the worker returned no generator state"))
	}

	// History: the variant appends the generated latents; then the newest latents (all of them
	// the first time) are decoded and blended into the pixels.
	next := &history{section: i, generator: gen}
	latents, added, err := j.variant.Append(sec, start, hist.latents, generated)
	if err != nil {
		return jobs.Result{}, fmt.Errorf("section %d: history: %w", i, err)
	}
	next.latents, next.totalGenerated = latents, hist.totalGenerated+added
	toDecode := j.variant.DecodeRange(sec, next.latents, next.totalGenerated, hist.pixels == nil)
	decIn, err := j.segment(sfx + "decode-in")
	if err != nil {
		return jobs.Result{}, err
	}
	decOut, err := j.segment(sfx + "decode-out")
	if err != nil {
		return jobs.Result{}, err
	}
	segs = append(segs, sfx+"decode-in", sfx+"decode-out")
	if _, err := shm.WriteSegment(decIn, []safetensors.Tensor{f32Tensor("latents", divided(toDecode, j.cond.scalingFactor))}); err != nil {
		return jobs.Result{}, fmt.Errorf("section %d: decode input: %w", i, err)
	}
	decRep, err := j.workerStage(ctx, framepackv1.Stage_STAGE_VAE_DECODE, i, lanes.Stage{
		Model: lanes.VAE, ModelDir: j.r.cfg.Models.VAE(), KeepWith: j.keepWith(),
		Request: &workerkit.VAEDecodeRequest{Latents: workerkit.TensorRef{Path: decIn, Name: "latents"}, Tiling: j.vaeTiling(),
			Pixels: workerkit.TensorRef{Path: decOut, Name: "pixels"}},
	})
	if err != nil {
		return jobs.Result{}, err
	}
	current, err := readSegmentVol(decOut, "pixels")
	if err == nil && (decRep.Loaded == nil || decRep.Loaded.VAE == nil || float32(decRep.Loaded.VAE.ScalingFactor) != j.cond.scalingFactor) {
		err = fmt.Errorf("the decoding vae's scaling factor is not the %s the start frame was encoded with", j.cond.scalingFactorStr)
	}
	if err != nil {
		return jobs.Result{}, j.failure(ctx, framepackv1.Stage_STAGE_VAE_DECODE, i, sectionStart, 0, err)
	}
	j.dropSegments(sfx+"decode-in", sfx+"decode-out")

	var res jobs.Result
	var out video.Output
	if err := j.hostStage(ctx, framepackv1.Stage_STAGE_WRITE_VIDEO, i, func() error {
		pixels := current
		if hist.pixels != nil {
			if pixels, err = j.variant.Blend(sec, current, *hist.pixels); err != nil {
				return fmt.Errorf("blend: %w", err)
			}
		}
		next.pixels = &pixels
		out, err = j.saveSection(ctx, next)
		return err
	}); err != nil {
		return jobs.Result{}, err
	}
	j.hist = next
	j.emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SectionVideo{SectionVideo: &framepackv1.SectionVideo{
		SectionIndex: uint32(i), Path: out.Path, FrameCount: uint32(out.Frames)}}})
	j.eta.sectionDone(time.Since(sectionStart))
	res = jobs.Result{VideoPath: out.Path, FrameCount: out.Frames, PNGFrames: out.Format == video.FormatPNG}
	return res, nil
}

// keepWith is the section loop's residency pair, when residency is on.
func (j *jobRun) keepWith() []lanes.Model {
	if !j.r.cfg.Residency {
		return nil
	}
	return sectionPair
}

// saveSection writes the section's history file and MP4, then records the checkpoint; only
// then are the previous section's history file and (unless KeepSectionVideos) its MP4
// removed, so a failure at any point leaves the last finished section whole. A disk too full
// for the section fails before anything is written (ErrDiskFull).
func (j *jobRun) saveSection(ctx context.Context, h *history) (_ video.Output, err error) {
	dir := j.job.Dir
	if err := j.checkDisk(h); err != nil {
		return video.Output{}, err
	}
	rel := filepath.Join(filepath.Base(dir.History()), SectionFile(h.section))
	histPath := filepath.Join(dir.Path(), rel)
	name := filepath.Join(dir.Videos(), fmt.Sprintf("section-%03d.mp4", h.section))
	defer func() {
		if err != nil {
			// Leave the previous section as the job's last: drop this one's files.
			_ = os.Remove(histPath)
			_ = os.Remove(name)
			_ = os.Remove(settingsPath(name))
			err = diskError(err)
		}
	}()
	if err := h.save(histPath); err != nil {
		return video.Output{}, err
	}
	frames, err := imageproc.VideoFrames(*h.pixels)
	if err != nil {
		return video.Output{}, fmt.Errorf("frames: %w", err)
	}
	frames = j.cond.withInputFrames(frames) // a video extension's input first
	settings, err := json.Marshal(j.settings(h.section))
	if err != nil {
		return video.Output{}, fmt.Errorf("settings: %w", err)
	}
	out, err := j.r.cfg.Video.Write(ctx, name, video.Clip{Frames: frames.T, Height: frames.H, Width: frames.W, RGB: frames.Pix,
		Metadata: map[string]string{"comment": string(settings)}}, int(j.job.Spec.GetMp4Crf()))
	if err != nil {
		return video.Output{}, err
	}
	if err := writeSettings(out.Path, settings); err != nil {
		return video.Output{}, err
	}
	if out.Note != "" {
		j.log.WithField("path", out.Path).Warn(out.Note)
	}
	cp := jobs.Checkpoint{Section: h.section, Sections: j.total, Variant: j.variant.Name(), VideoPath: out.Path, FrameCount: out.Frames,
		Files: map[string]string{cpConditioning: filepath.Join(filepath.Base(dir.History()), ConditioningFile), cpSection: rel}}
	if err := j.job.SaveCheckpoint(cp); err != nil {
		return video.Output{}, fmt.Errorf("checkpoint: %w", err)
	}
	if h.section > 0 && !j.r.cfg.KeepSectionHistory {
		prev := filepath.Join(dir.History(), SectionFile(h.section-1))
		if err := os.Remove(prev); err != nil && !errors.Is(err, os.ErrNotExist) {
			j.log.WithError(err).Warn("remove previous section history")
		}
	}
	if h.section > 0 && !j.r.cfg.KeepSectionVideos {
		// The new video holds every frame of the previous one: it is superseded, with its
		// settings file (metadata.go) and any PNG frames.
		prevVideo := filepath.Join(dir.Videos(), fmt.Sprintf("section-%03d.mp4", h.section-1))
		for _, prev := range []string{prevVideo, settingsPath(prevVideo), video.FramesDir(prevVideo)} {
			if err := os.RemoveAll(prev); err != nil {
				j.log.WithError(err).Warn("remove superseded section video")
			}
		}
	}
	return out, nil
}

// ErrDiskFull marks a section that could not be written for lack of disk space; the job fails
// with its previous section as its last video and checkpoint.
var ErrDiskFull = errors.New("disk full")

// checkDisk fails with ErrDiskFull when the state directory's file system has less free space
// than the section's files need (Config.FreeBytes).
func (j *jobRun) checkDisk(h *history) error {
	if j.r.cfg.FreeBytes == nil {
		return nil
	}
	free, err := j.r.cfg.FreeBytes(j.job.Dir.Path())
	if err != nil {
		return nil // cannot tell: the writes themselves will say
	}
	need := uint64(len(h.latents.Data)+len(h.pixels.Data))*4 + uint64(h.pixels.T*h.pixels.H*h.pixels.W)*3/2 + 1<<20
	if free < need {
		return fmt.Errorf("%w: the section needs about %d MiB, %d MiB are free on the state directory; the job stops with section %d as its last video (free space, then submit again)",
			ErrDiskFull, need>>20, free>>20, h.section) // h.section-1, counted from 1
	}
	return nil
}

// diskError marks an out-of-space error from a write as ErrDiskFull, so the message says so
// in the user's terms.
func diskError(err error) error {
	if err == nil || errors.Is(err, ErrDiskFull) {
		return err
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || strings.Contains(err.Error(), "No space left on device") {
		return fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	return err
}

// stepTracker turns the transformer's events into SamplingStep and Preview events.
type stepTracker struct {
	j       *jobRun
	section int
	mu      sync.Mutex
	last    time.Time
}

func (s *stepTracker) onEvent(e workerkit.Event) error {
	j := s.j
	switch ev := e.(type) {
	case *workerkit.Progress:
		if ev.Phase != "sample" || ev.Step == 0 {
			return nil
		}
		s.mu.Lock()
		now := time.Now()
		d := now.Sub(s.last)
		s.last = now
		s.mu.Unlock()
		j.eta.stepDone(d)
		eta := j.eta.estimate(s.section, int(ev.Step))
		j.emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{
			SectionIndex: uint32(s.section), Step: ev.Step, TotalSteps: ev.TotalSteps,
			StepDuration: durationpb.New(d), Eta: durationpb.New(eta)}}})
	case *workerkit.StepPreview:
		png, err := previewPNG(ev.Denoised.Path, ev.Denoised.Name)
		if rerr := os.Remove(ev.Denoised.Path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			j.log.WithError(rerr).Debug("remove preview segment")
		}
		if err != nil {
			j.log.WithError(err).Warn("preview")
			return nil
		}
		j.emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_Preview{Preview: &framepackv1.Preview{
			SectionIndex: uint32(s.section), Step: ev.Step, Png: png}}})
	case *workerkit.ConvFallback:
		j.emit(fallbackEvent(framepackv1.Stage_STAGE_TRANSFORMER, ev))
	case *workerkit.LogLine:
		j.workerLog(framepackv1.Stage_STAGE_TRANSFORMER, ev)
	}
	return nil
}

// reserveBytes is Workload.ReserveBytes for the transformer: FramePack's
// gpu_memory_preservation_gb when the lane gives no cap (the worker then keeps it free beside its
// resident weights), else 0, since the lane's cap already leaves the preservation out
// (lanes.Lane.MemoryCap) and reserving it again under the cap would count it twice.
func (j *jobRun) reserveBytes() uint64 {
	if j.memCap != 0 {
		return 0
	}
	return j.preserve
}
