package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
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

// section runs section i: sample, decode, blend, write the MP4, checkpoint.
func (j *jobRun) section(ctx context.Context, i int, condSeg string) (jobs.Result, error) {
	sectionStart := time.Now()
	sec := Section{Index: i, Total: j.total, Window: j.window}
	hist := j.hist
	sfx := fmt.Sprintf("s%03d-", i)
	start := j.cond.startLatent

	// Clean latents 1x/2x/4x and the frame indices, as the job's variant takes them.
	sc, err := j.variant.Context(sec, start, hist.latents)
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
		UseTeaCache: spec.GetUseTeacache(), Sampler: workerkit.SamplerUniPCBH1,
		GeneratorState: hist.generator, Seed: spec.GetSeed(),
		Width: uint32(j.cond.width), Height: uint32(j.cond.height), Frames: uint32(plan.Frames(j.window)),
		Latents:      workerkit.TensorRef{Path: latSeg, Name: "latents"},
		StepPreviews: previews,
	}
	steps := &stepTracker{j: j, section: i, last: time.Now()}
	j.planResidency(ctx)
	tst := j.transformerStage(req)
	tst.OnEvent = steps.onEvent
	rep, err := j.workerStage(ctx, framepackv1.Stage_STAGE_TRANSFORMER, i, tst)
	if err != nil {
		return jobs.Result{}, err
	}
	if l := loadedLoras(rep); len(l) > 0 {
		j.lorasApplied = l
	}
	if rep.Loaded != nil && rep.Loaded.WeightsFormat != "" {
		j.weightsFormat, j.fp8Compute = rep.Loaded.WeightsFormat, rep.Loaded.FP8Compute
	}
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
	next := &history{section: i, generator: gen, segments: hist.segments, frames: hist.frames}
	latents, added, err := j.variant.Append(sec, start, hist.latents, generated)
	if err != nil {
		return jobs.Result{}, fmt.Errorf("section %d: history: %w", i, err)
	}
	next.latents, next.totalGenerated = latents, hist.totalGenerated+added
	toDecode := j.variant.DecodeRange(sec, next.latents, next.totalGenerated, hist.section < 0)
	current, err := j.decode(ctx, i, toDecode, sectionStart)
	if err != nil {
		return jobs.Result{}, err
	}

	var res jobs.Result
	var out video.Output
	if err := j.hostStage(ctx, framepackv1.Stage_STAGE_WRITE_VIDEO, i, func() error {
		keep, pending, final, err := j.blend(sec, hist, current)
		if err != nil {
			return err
		}
		next.pixels = &keep
		if !j.r.cfg.KeepSectionHistory {
			next.latents = retain(j.variant, next.latents, j.window)
		}
		out, err = j.saveSection(ctx, next, pending, final)
		return err
	}); err != nil {
		return jobs.Result{}, err
	}
	j.hist = next
	j.emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SectionVideo{SectionVideo: &framepackv1.SectionVideo{
		SectionIndex: uint32(i), Path: out.Path, FrameCount: uint32(out.Frames)}}})
	j.r.rests.put(j.restKey(), j.eta.sectionDone(time.Since(sectionStart)))
	res = jobs.Result{VideoPath: out.Path, FrameCount: out.Frames, PNGFrames: out.Format == video.FormatPNG}
	return res, nil
}

// transformerStage is the section loop's transformer stage for req (nil: for its estimate),
// with the residency plan's cap.
func (j *jobRun) transformerStage(req workerkit.Stage) lanes.Stage {
	spec := j.job.Spec
	st := lanes.Stage{Model: lanes.Transformer, ModelDir: j.r.transformerDir(j.variant.Name()), Request: req, Loras: jobLoras(spec),
		Checkpoint: spec.GetTransformerCheckpoint(), Weights: spec.GetWeights(), FP8Compute: spec.GetFp8Compute(),
		Workload: &workerkit.Workload{Height: uint32(j.cond.height), Width: uint32(j.cond.width), LatentWindowSize: uint32(j.window),
			ReserveBytes: j.reserveBytes()}}
	if p := j.section0; p != nil {
		st.Cap, st.Keep = p.transformer, p.keep
	}
	return st
}

// vaeStage is a VAE stage for req. Encode and decode carry the same workload, so one worker
// loaded for the job serves both, and its estimate covers the largest decode.
func (j *jobRun) vaeStage(req workerkit.Stage) lanes.Stage {
	return lanes.Stage{Model: lanes.VAE, ModelDir: j.r.cfg.Models.VAE(), Request: req,
		Workload: &workerkit.Workload{Height: uint32(j.cond.height), Width: uint32(j.cond.width), LatentWindowSize: uint32(j.window)}}
}

// decodeStage is the section loop's VAE decode for req (nil: for its estimate), with the
// residency plan's cap.
func (j *jobRun) decodeStage(req workerkit.Stage) lanes.Stage {
	st := j.vaeStage(req)
	if p := j.section0; p != nil {
		st.Cap, st.Keep = p.vae, p.keep
	}
	return st
}

// decode runs section i's VAE decode of latents (history latents, scaled) and returns the
// pixels.
func (j *jobRun) decode(ctx context.Context, i int, latents vol, sectionStart time.Time) (vol, error) {
	sfx := fmt.Sprintf("s%03d-", i)
	decIn, err := j.segment(sfx + "decode-in")
	if err != nil {
		return vol{}, err
	}
	decOut, err := j.segment(sfx + "decode-out")
	if err != nil {
		return vol{}, err
	}
	defer j.dropSegments(sfx+"decode-in", sfx+"decode-out")
	if _, err := shm.WriteSegment(decIn, []safetensors.Tensor{f32Tensor("latents", divided(latents, j.cond.scalingFactor))}); err != nil {
		return vol{}, fmt.Errorf("section %d: decode input: %w", i, err)
	}
	st := j.decodeStage(&workerkit.VAEDecodeRequest{Latents: workerkit.TensorRef{Path: decIn, Name: "latents"}, Tiling: j.vaeTiling(),
		Pixels: workerkit.TensorRef{Path: decOut, Name: "pixels"}})
	st.OnEvent = j.decodeEvents(i, sectionStart)
	rep, err := j.workerStage(ctx, framepackv1.Stage_STAGE_VAE_DECODE, i, st)
	if err != nil {
		return vol{}, err
	}
	current, err := readSegmentVol(decOut, "pixels")
	if err == nil && (rep.Loaded == nil || rep.Loaded.VAE == nil || float32(rep.Loaded.VAE.ScalingFactor) != j.cond.scalingFactor) {
		err = fmt.Errorf("the decoding vae's scaling factor is not the %s the start frame was encoded with", j.cond.scalingFactorStr)
	}
	if err != nil {
		return vol{}, j.failure(ctx, framepackv1.Stage_STAGE_VAE_DECODE, i, sectionStart, 0, err)
	}
	return current, nil
}

// restorePending decodes again, after a resume, the pixels the checkpointed section left for
// the next one to blend with (the checkpoint keeps the latents they decode from, not their
// float bytes): the same decode of the same latents the section ran.
func (j *jobRun) restorePending(ctx context.Context) error {
	h := j.hist
	sec := Section{Index: h.section, Total: j.total, Window: j.window}
	j.planResidency(ctx)
	current, err := j.decode(ctx, h.section, j.variant.DecodeRange(sec, h.latents, h.totalGenerated, h.section == 0), time.Now())
	if err != nil {
		return err
	}
	p := pendingOf(j.variant, current, plan.Overlap(j.window))
	h.pixels = &p
	return nil
}

// blend joins section sec's decoded pixels current with the history's pixels and splits the
// result into the frames no later blend touches (final, in time order: the section's segment of
// the video), the frames the next section blends with (pending: plan.Overlap of them at the end
// the history grows from, none after the last section) and the pixels the history keeps: the
// pending frames, or every frame with KeepSectionHistory.
func (j *jobRun) blend(sec Section, hist *history, current vol) (keep, pending, final vol, err error) {
	result, prev := current, 0
	if hist.pixels != nil && hist.pixels.T > 0 {
		if result, err = j.variant.Blend(sec, current, *hist.pixels); err != nil {
			return vol{}, vol{}, vol{}, fmt.Errorf("blend: %w", err)
		}
		prev = hist.pixels.T
	}
	o := plan.Overlap(sec.Window)
	emitted := prev - min(o, prev) // frames of the history's pixels already in segments
	n := result.T
	pend := min(o, n-emitted)
	if sec.Last() {
		pend = 0
	}
	var f0, f1, p0, p1 int
	if j.variant.Prepends() { // [pending | new final frames | emitted]
		p0, p1, f0, f1 = 0, pend, pend, n-emitted
	} else { // [emitted | new final frames | pending]
		f0, f1, p0, p1 = emitted, n-pend, n-pend, n
	}
	final, pending = sliceT(result, f0, f1), sliceT(result, p0, p1)
	if j.r.cfg.KeepSectionHistory {
		return result, pending, final, nil
	}
	return pending, pending, final, nil
}

// pendingOf is the part of a section's decoded pixels current the next section blends with,
// as blend leaves it: that section's decode never reaches past the overlap at the growing end,
// so the pending frames are the decode's own (blended with nothing yet). A resume decodes them
// again from the retained latents instead of keeping them in the checkpoint.
func pendingOf(v Variant, current vol, overlap int) vol {
	n := min(overlap, current.T)
	if v.Prepends() {
		return sliceT(current, 0, n)
	}
	return sliceT(current, current.T-n, current.T)
}

// retain is the part of the history latents a later section reads: its clean-latent context
// (plan.CleanFrames) and its decode range (at most plan.DecodeFrames), at the end the history
// grows from. The rest is in the video already and leaves memory and the checkpoint.
func retain(v Variant, latents vol, window int) vol {
	keep := max(plan.CleanFrames, plan.DecodeFrames(window, true))
	if latents.T <= keep {
		return latents
	}
	if v.Prepends() {
		return sliceT(latents, 0, keep)
	}
	return sliceT(latents, latents.T-keep, latents.T)
}

// Files of a job's video folder (jobs.Dir.Videos()).
const (
	// segmentsDir holds the segments the videos are joined from.
	segmentsDir = "segments"
	// segmentPattern is the frames a section finished, encoded once.
	segmentPattern = "seg-%03d.mp4"
	// pendingPattern is the frames of a section the next one still blends (for the video so
	// far only, in the job's shared memory; replaced by the next section's).
	pendingPattern = "pending-%03d.mp4"
	// sectionVideoPattern is the video after a section: joined from the segments when first
	// read (video.Materialize), at once after the last section.
	sectionVideoPattern = "section-%03d.mp4"
)

// sectionVideo is the path of the video after section i.
func (j *jobRun) sectionVideo(i int) string {
	return filepath.Join(j.job.Dir.Videos(), fmt.Sprintf(sectionVideoPattern, i))
}

// saveSection writes the section's frames that are final as a segment of their own (each frame
// is encoded once) and the frames the next section blends as the pending segment (in the job's
// shared memory, not on disk: the next section replaces them), the parts file of the video so
// far, its settings and the section's history file (the latents later sections read, the
// generator and the segment list), then records the
// checkpoint; only then are the previous section's history file, pending segment and video so
// far removed, so a failure at any point leaves the last finished section whole. The video so
// far is joined from the segments when a client first reads it; after the last section at
// once (it is the job's video). A disk too full for the section fails before anything is
// written (ErrDiskFull).
func (j *jobRun) saveSection(ctx context.Context, h *history, pending, final vol) (_ video.Output, err error) {
	dir := j.job.Dir
	if err := j.checkDisk(h, pending, final); err != nil {
		return video.Output{}, err
	}
	segDir := filepath.Join(dir.Videos(), segmentsDir)
	if err := os.MkdirAll(segDir, 0o755); err != nil {
		return video.Output{}, fmt.Errorf("segments: %w", err)
	}
	rel := filepath.Join(filepath.Base(dir.History()), SectionFile(h.section))
	histPath := filepath.Join(dir.Path(), rel)
	name := j.sectionVideo(h.section)
	var made []string // this section's files, removed if it fails
	defer func() {
		if err != nil {
			// Leave the previous section as the job's last: drop this one's files.
			for _, p := range append(made, histPath, name, video.FramesDir(name), video.PartsPath(name), settingsPath(name)) {
				_ = os.RemoveAll(p)
			}
			err = diskError(err)
		}
	}()
	crf := int(j.job.Spec.GetMp4Crf())
	write := func(dir, pattern string, v vol) (string, video.Output, error) {
		frames, err := imageproc.VideoFrames(v)
		if err != nil {
			return "", video.Output{}, fmt.Errorf("frames: %w", err)
		}
		p := filepath.Join(dir, fmt.Sprintf(pattern, h.section))
		out, err := j.r.cfg.Video.Write(ctx, p, video.Clip{Frames: frames.T, Height: frames.H, Width: frames.W, RGB: frames.Pix}, crf)
		if err != nil {
			return "", video.Output{}, err
		}
		made = append(made, out.Path)
		if out.Note != "" {
			j.log.WithField("path", out.Path).Debug(out.Note)
		}
		return filepath.Join(segmentsDir, filepath.Base(out.Path)), out, nil
	}
	segments := slices.Clone(h.segments)
	format := video.FormatMP4
	frames := h.frames
	if final.T > 0 {
		seg, out, err := write(segDir, segmentPattern, final)
		if err != nil {
			return video.Output{}, err
		}
		if j.variant.Prepends() {
			segments = append([]string{seg}, segments...)
		} else {
			segments = append(segments, seg)
		}
		format, frames = out.Format, frames+out.Frames
	}
	h.segments, h.frames = segments, frames
	settings, err := json.Marshal(j.settings(h.section))
	if err != nil {
		return video.Output{}, fmt.Errorf("settings: %w", err)
	}
	parts := video.Parts{Segments: segments, Frames: frames, Metadata: map[string]string{"comment": string(settings)}}
	if pending.T > 0 {
		// The frames the next section blends are in the video so far, but not written to
		// disk: they live in the job's shared memory until the next section replaces them.
		pendDir := filepath.Join(j.arena.Dir(), "video")
		if err := os.MkdirAll(pendDir, 0o700); err != nil {
			return video.Output{}, fmt.Errorf("pending frames: %w", err)
		}
		_, out, err := write(pendDir, pendingPattern, pending)
		if err != nil {
			return video.Output{}, err
		}
		parts.Pending, parts.PendingFirst, parts.PendingFrames, format = out.Path, j.variant.Prepends(), out.Frames, out.Format
	}
	if len(parts.Segments) == 0 && parts.Pending == "" {
		return video.Output{}, errors.New("the section left no frames to write")
	}
	if err := video.WriteParts(name, parts); err != nil {
		return video.Output{}, err
	}
	// Until it is joined the video so far is named by its MP4 name in either format: its parts
	// file is written beside that name, and video.Writer.Materialize makes the MP4 or, without
	// ffmpeg, the PNG folder (video.FramesDir) from it when it is first read.
	out := video.Output{Path: name, Format: format, Frames: parts.Frames + parts.PendingFrames}
	if h.section == j.total-1 || j.r.cfg.KeepSectionVideos {
		if out, err = j.r.cfg.Video.Join(ctx, name, parts); err != nil {
			return video.Output{}, err
		}
		if out.Note != "" {
			j.log.WithField("path", out.Path).Warn(out.Note)
		}
	}
	if err := writeSettings(out.Path, settings); err != nil {
		return video.Output{}, err
	}
	if err := h.save(histPath, j.r.cfg.KeepSectionHistory); err != nil {
		return video.Output{}, err
	}
	cp := jobs.Checkpoint{Section: h.section, Sections: j.total, Variant: j.variant.Name(), VideoPath: out.Path, FrameCount: out.Frames,
		Files: map[string]string{cpConditioning: filepath.Join(filepath.Base(dir.History()), ConditioningFile), cpSection: rel}}
	// The segments the video is joined from, and its parts file (a store that moves checkpoints
	// between daemons carries them along: supervisor/cluster); after the last section the
	// joined video holds them.
	videos := filepath.Base(dir.Videos())
	if h.section == j.total-1 {
		segments = nil
	} else if _, err := os.Stat(video.PartsPath(name)); err == nil {
		cp.Files[cpParts] = filepath.Join(videos, filepath.Base(video.PartsPath(name)))
	}
	for _, seg := range segments {
		if strings.HasSuffix(seg, video.FramesDirExt) {
			continue // a PNG folder: the store checks files
		}
		cp.Files[cpSegment+seg] = filepath.Join(videos, seg)
	}
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
		// The new video so far holds every frame of the previous one: it, its parts, its
		// settings file and its pending segment are superseded.
		prevVideo := j.sectionVideo(h.section - 1)
		prevPending := filepath.Join(j.arena.Dir(), "video", fmt.Sprintf(pendingPattern, h.section-1))
		for _, prev := range []string{prevVideo, video.PartsPath(prevVideo), settingsPath(prevVideo), video.FramesDir(prevVideo),
			prevPending, video.FramesDir(prevPending)} {
			if err := os.RemoveAll(prev); err != nil {
				j.log.WithError(err).Warn("remove superseded section video")
			}
		}
	}
	if h.section == j.total-1 && !j.r.cfg.KeepSectionVideos {
		// The job's video holds every segment: they are no longer needed.
		if err := os.RemoveAll(segDir); err != nil {
			j.log.WithError(err).Warn("remove segments")
		}
	}
	thumb := final
	if thumb.T == 0 {
		thumb = pending
	}
	if err := writeThumbnail(dir.Thumbnail(), thumb); err != nil {
		j.log.WithError(err).Warn("thumbnail") // the page shows the start image instead
	}
	return out, nil
}

// legacySegment turns the pixels of a history saved before segments (every frame) into the
// video's first segment (the frames no later blend touches) and the pending frames.
func (j *jobRun) legacySegment(h *history) error {
	o := plan.Overlap(j.window)
	p := *h.pixels
	if p.T <= o {
		return nil
	}
	final, pend := sliceT(p, o, p.T), sliceT(p, 0, o)
	if !j.variant.Prepends() {
		final, pend = sliceT(p, 0, p.T-o), sliceT(p, p.T-o, p.T)
	}
	frames, err := imageproc.VideoFrames(final)
	if err != nil {
		return err
	}
	segDir := filepath.Join(j.job.Dir.Videos(), segmentsDir)
	if err := os.MkdirAll(segDir, 0o755); err != nil {
		return err
	}
	out, err := j.r.cfg.Video.Write(context.Background(), filepath.Join(segDir, "seg-legacy.mp4"),
		video.Clip{Frames: frames.T, Height: frames.H, Width: frames.W, RGB: frames.Pix}, int(j.job.Spec.GetMp4Crf()))
	if err != nil {
		return err
	}
	h.segments, h.frames = []string{filepath.Join(segmentsDir, filepath.Base(out.Path))}, out.Frames
	if !j.r.cfg.KeepSectionHistory {
		h.pixels = &pend
		h.latents = retain(j.variant, h.latents, j.window)
	}
	return nil
}

// ErrDiskFull marks a section that could not be written for lack of disk space; the job fails
// with its previous section as its last video and checkpoint.
var ErrDiskFull = errors.New("disk full")

// checkDisk fails with ErrDiskFull when the state directory's file system has less free space
// than the section's files need (Config.FreeBytes).
func (j *jobRun) checkDisk(h *history, pending, final vol) error {
	if j.r.cfg.FreeBytes == nil {
		return nil
	}
	free, err := j.r.cfg.FreeBytes(j.job.Dir.Path())
	if err != nil {
		return nil // cannot tell: the writes themselves will say
	}
	// the history file, the segments (at most as large as raw yuv420p) and, after the last
	// section, the joined video
	frames := uint64(final.T) // the pending frames go to shared memory
	if h.section == j.total-1 {
		frames += uint64(h.frames)
	}
	need := uint64(len(h.latents.Data))*4 + frames*uint64(max(final.H*final.W, pending.H*pending.W))*3/2 + 1<<20
	if j.r.cfg.KeepSectionHistory {
		need += uint64(len(h.pixels.Data)) * 4
	}
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
		eta, frac := j.eta.estimate(s.section, int(ev.Step))
		j.emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_SamplingStep{SamplingStep: &framepackv1.SamplingStep{
			SectionIndex: uint32(s.section), Step: ev.Step, TotalSteps: ev.TotalSteps,
			StepDuration: durationpb.New(d), Eta: durationpb.New(eta), Fraction: frac}}})
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

// decodeEvents handles the VAE decode's events of section i: the worker's progress after each
// model run (tile or chunk of frames) becomes a StageProgress event with the job's ETA and
// share done; fallbacks and log lines go where every stage's go.
func (j *jobRun) decodeEvents(i int, sectionStart time.Time) func(workerkit.Event) error {
	other := j.workerEvent(framepackv1.Stage_STAGE_VAE_DECODE)
	return func(e workerkit.Event) error {
		ev, ok := e.(*workerkit.Progress)
		if !ok {
			return other(e)
		}
		if ev.Phase != "decode" || ev.Step == 0 || ev.TotalSteps == 0 {
			return nil
		}
		eta, frac := j.eta.decodeEstimate(i, int(ev.Step), int(ev.TotalSteps), ev.Elapsed, time.Since(sectionStart))
		j.emit(&framepackv1.JobEvent{Event: &framepackv1.JobEvent_StageProgress{StageProgress: &framepackv1.StageProgress{
			Stage: framepackv1.Stage_STAGE_VAE_DECODE, SectionIndex: uint32(i), Done: ev.Step, Total: ev.TotalSteps,
			Elapsed: durationpb.New(ev.Elapsed), Eta: durationpb.New(eta), Fraction: frac}}})
		return nil
	}
}

// restKey names the job's shape for the lane's memory of a section's rest (restMemo).
func (j *jobRun) restKey() restKey {
	k := restKey{lane: j.job.Lane, window: j.window}
	if j.cond != nil {
		k.height, k.width = j.cond.height, j.cond.width
	}
	return k
}
