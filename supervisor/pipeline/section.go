package pipeline

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
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
	w := j.window
	pad := j.paddings[i]
	last := pad == 0
	idx := plan.SectionIndices(pad, w)
	hist := j.hist
	sfx := fmt.Sprintf("s%03d-", i)

	// Clean latents: the start latent and the newest history frame (1x), then 2 and 16 more
	// history frames (2x, 4x).
	start := j.cond.startLatent
	clean, err := concatT(start, sliceT(hist.latents, 0, plan.Clean1x))
	if err != nil {
		return jobs.Result{}, fmt.Errorf("section %d: clean latents: %w", i, err)
	}
	clean2x := sliceT(hist.latents, plan.Clean1x, plan.Clean1x+plan.Clean2x)
	clean4x := sliceT(hist.latents, plan.Clean1x+plan.Clean2x, plan.CleanFrames)
	cleanSeg, err := j.segment(sfx + "clean")
	if err != nil {
		return jobs.Result{}, err
	}
	if _, err := shm.WriteSegment(cleanSeg, []safetensors.Tensor{f32Tensor("clean", clean), f32Tensor("clean_2x", clean2x),
		f32Tensor("clean_4x", clean4x)}); err != nil {
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
	req := &workerkit.TransformerSectionRequest{
		TransformerConditioning: workerkit.TransformerConditioning{
			TransformerText: workerkit.TransformerText{LlamaVec: cref(tLlamaVec), LlamaMask: cref(tLlamaMask), ClipPooler: cref(tClipPooler)},
			ImageEmbeddings: cref(tImageHidden),
			CleanLatents:    workerkit.TensorRef{Path: cleanSeg, Name: "clean"}, CleanLatentIndices: idx.Clean,
			CleanLatents2x: workerkit.TensorRef{Path: cleanSeg, Name: "clean_2x"}, CleanLatent2xIndices: idx.Clean2x,
			CleanLatents4x: workerkit.TensorRef{Path: cleanSeg, Name: "clean_4x"}, CleanLatent4xIndices: idx.Clean4x,
			LatentIndices: idx.Latent,
		},
		Negative: workerkit.TransformerText{LlamaVec: cref(tLlamaVecN), LlamaMask: cref(tLlamaMaskN), ClipPooler: cref(tClipPoolerN)},
		Steps:    uint32(j.steps), CFG: spec.GetCfg(), GS: spec.GetGs(), RS: spec.GetRs(),
		UseTeaCache: spec.GetUseTeacache(), Sampler: workerkit.SamplerUniPCBH1,
		GeneratorState: hist.generator, Seed: spec.GetSeed(),
		Width: uint32(j.cond.width), Height: uint32(j.cond.height), Frames: uint32(plan.Frames(w)),
		Latents:      workerkit.TensorRef{Path: latSeg, Name: "latents"},
		StepPreviews: previews,
	}
	steps := &stepTracker{j: j, section: i, last: time.Now()}
	rep, err := j.workerStage(ctx, framepackv1.Stage_STAGE_TRANSFORMER, i, lanes.Stage{
		Model: lanes.Transformer, ModelDir: j.r.cfg.Models.Transformer, Request: req, KeepWith: j.keepWith(),
		OnEvent: steps.onEvent,
	})
	if err != nil {
		return jobs.Result{}, err
	}
	generated, err := readSegmentVol(latSeg, "latents")
	if err != nil {
		return jobs.Result{}, j.failure(ctx, framepackv1.Stage_STAGE_TRANSFORMER, i, sectionStart, 0, err)
	}
	gen := rep.Result.GeneratorState
	if len(gen) == 0 {
		return jobs.Result{}, j.failure(ctx, framepackv1.Stage_STAGE_TRANSFORMER, i, sectionStart, 0, errors.New("the worker returned no generator state"))
	}

	// History: the last section also holds the start latent; the newest frames go first.
	if last {
		if generated, err = concatT(start, generated); err != nil {
			return jobs.Result{}, fmt.Errorf("section %d: %w", i, err)
		}
	}
	next := &history{section: i, totalGenerated: hist.totalGenerated + generated.T, generator: gen}
	if next.latents, err = concatT(generated, hist.latents); err != nil {
		return jobs.Result{}, fmt.Errorf("section %d: history: %w", i, err)
	}
	real := sliceT(next.latents, 0, next.totalGenerated)

	// Decode the newest latents (all of them the first time) and blend them into the pixels.
	toDecode := real
	if hist.pixels != nil {
		toDecode = sliceT(real, 0, plan.DecodeFrames(w, last))
	}
	decIn, err := j.segment(sfx + "decode-in")
	if err != nil {
		return jobs.Result{}, err
	}
	decOut, err := j.segment(sfx + "decode-out")
	if err != nil {
		return jobs.Result{}, err
	}
	segs = append(segs, sfx+"decode-in", sfx+"decode-out")
	if _, err := shm.WriteSegment(decIn, []safetensors.Tensor{f32Tensor("latents", divided(toDecode, j.r.scalingFactor))}); err != nil {
		return jobs.Result{}, fmt.Errorf("section %d: decode input: %w", i, err)
	}
	if _, err := j.workerStage(ctx, framepackv1.Stage_STAGE_VAE_DECODE, i, lanes.Stage{
		Model: lanes.VAE, ModelDir: j.r.cfg.Models.VAE(), KeepWith: j.keepWith(),
		Request: &workerkit.VAEDecodeRequest{Latents: workerkit.TensorRef{Path: decIn, Name: "latents"}, Tiling: j.vaeTiling(),
			Pixels: workerkit.TensorRef{Path: decOut, Name: "pixels"}},
	}); err != nil {
		return jobs.Result{}, err
	}
	current, err := readSegmentVol(decOut, "pixels")
	if err != nil {
		return jobs.Result{}, j.failure(ctx, framepackv1.Stage_STAGE_VAE_DECODE, i, sectionStart, 0, err)
	}
	j.dropSegments(sfx+"decode-in", sfx+"decode-out")

	var res jobs.Result
	var out video.Output
	if err := j.hostStage(ctx, framepackv1.Stage_STAGE_WRITE_VIDEO, i, func() error {
		pixels := current
		if hist.pixels != nil {
			// soft_append_bcthw(current_pixels, history_pixels, overlapped_frames)
			if pixels, err = imageproc.SoftAppend(current, *hist.pixels, plan.Overlap(w)); err != nil {
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

// saveSection writes the section's history file and MP4, then records the checkpoint.
func (j *jobRun) saveSection(ctx context.Context, h *history) (video.Output, error) {
	dir := j.job.Dir
	rel := filepath.Join(filepath.Base(dir.History()), SectionFile(h.section))
	if err := h.save(filepath.Join(dir.Path(), rel)); err != nil {
		return video.Output{}, err
	}
	frames, err := imageproc.VideoFrames(*h.pixels)
	if err != nil {
		return video.Output{}, fmt.Errorf("frames: %w", err)
	}
	name := filepath.Join(dir.Videos(), fmt.Sprintf("section-%03d.mp4", h.section))
	out, err := j.r.cfg.Video.Write(ctx, name, video.Clip{Frames: frames.T, Height: frames.H, Width: frames.W, RGB: frames.Pix}, int(j.job.Spec.GetMp4Crf()))
	if err != nil {
		return video.Output{}, err
	}
	if out.Note != "" {
		j.log.WithField("path", out.Path).Warn(out.Note)
	}
	cp := jobs.Checkpoint{Section: h.section, Sections: j.total, VideoPath: out.Path, FrameCount: out.Frames,
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
	return out, nil
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
