package pipeline

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// Video extension variants: FramePack-Studio's "Video" (the i2v transformer, sections generated
// backwards in time after the input video) and "Video F1" (the F1 transformer, forwards).
const (
	VariantVideo   = "video"
	VariantVideoF1 = "video_f1"
)

func init() {
	variants[VariantVideo] = videoVariant{backward: true}
	variants[VariantVideoF1] = videoVariant{}
}

// videoVariant is FramePack-Studio's video extension (modules/generators/video_generator.py and
// video_f1_generator.py at f4369da, with worker.py's Video branches): the history starts as the
// input video's latents; the clean-latent context of each section comes from
// video_prepare_clean_latents_and_indices (backward) or video_f1_prepare_clean_latents_and_indices
// (forward); generated latents go in front of the history (backward) or after it (forward),
// without the start latent the i2v loop prepends; every decode after the first decodes the
// newest 2·window latent frames. Unlike the other variants it carries per-job data: the input
// video's latents and the context frames, bound from the job's conditioning (withVideo), so a
// resumed job gets them from its conditioning file.
type videoVariant struct {
	backward bool
	video    *vol // the input video's latents [1, C, L, H, W]
	context  int  // num_cleaned_frames
}

func (v videoVariant) Name() string {
	if v.backward {
		return VariantVideo
	}
	return VariantVideoF1
}

// Prepends: "Video" grows its history at the start (generated sections in front of the input
// video's latents), "Video F1" at the end.
func (v videoVariant) Prepends() bool { return v.backward }

// keepsWholeHistory: the history keeps every latent (retain), since "Video" reads its 2x/4x
// context and the count of available frames from the input video's end of the history, the end
// that is final for the others.
func (videoVariant) keepsWholeHistory() bool { return true }

// withVideo binds the job's input video latents and context frames.
func (v videoVariant) withVideo(video vol, context int) videoVariant {
	v.video, v.context = &video, context
	return v
}

func (v videoVariant) InitialHistory(start vol, end *vol) (vol, int, error) {
	if end != nil {
		return vol{}, 0, fmt.Errorf("%w: a video extension takes no end frame", errBadInput)
	}
	if v.video == nil {
		return vol{}, 0, fmt.Errorf("the video variant has no input video latents")
	}
	// worker.py: history_latents = video_latents; total_generated_latent_frames = 0.
	return *v.video, 0, nil
}

func (v videoVariant) Context(s Section, _, hist vol) (SectionContext, error) {
	if v.video == nil {
		return SectionContext{}, fmt.Errorf("the video variant has no input video latents")
	}
	if v.backward {
		return videoContext(s, *v.video, hist, v.context)
	}
	return videoF1Context(s, *v.video, hist, v.context)
}

func (v videoVariant) Append(_ Section, _, hist, generated vol) (vol, int, error) {
	var out vol
	var err error
	if v.backward {
		out, err = concatT(generated, hist) // generated in front
	} else {
		out, err = concatT(hist, generated)
	}
	if err != nil {
		return vol{}, 0, err
	}
	return out, generated.T, nil
}

func (v videoVariant) DecodeRange(s Section, latents vol, generated int, first bool) vol {
	var real vol
	if v.backward {
		real = sliceT(latents, 0, generated)
	} else {
		real = sliceT(latents, latents.T-generated, latents.T)
	}
	if first {
		return real
	}
	n := min(2*s.Window, real.T) // get_section_latent_frames: 2·window, also for the last section
	if v.backward {
		return sliceT(real, 0, n)
	}
	return sliceT(real, real.T-n, real.T)
}

func (v videoVariant) Blend(s Section, current, history vol) (vol, error) {
	if v.backward {
		return imageproc.SoftAppend(current, history, plan.Overlap(s.Window))
	}
	return imageproc.SoftAppend(history, current, plan.Overlap(s.Window))
}

func (v videoVariant) TimeIndex(s Section) int {
	if v.backward {
		return s.Total - 1 - s.Index
	}
	return s.Index
}

// seq is [from, from+n) as indices.
func seq(from, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(from + i)
	}
	return out
}

// tailT is a[:, :, -n:] (all of a when n ≥ a.T).
func tailT(a vol, n int) vol { return sliceT(a, max(a.T-n, 0), a.T) }

// repeatT is x.repeat(1, 1, ceil(n / x.T), 1, 1)[:, :, :n]: x's frames tiled to n frames.
func repeatT(x vol, n int) (vol, error) {
	if x.T >= n {
		return sliceT(x, 0, n), nil
	}
	parts := make([]vol, (n+x.T-1)/x.T)
	for i := range parts {
		parts[i] = x
	}
	all, err := concatT(parts...)
	if err != nil {
		return vol{}, err
	}
	return sliceT(all, 0, n), nil
}

// videoContext is VideoModelGenerator.video_prepare_clean_latents_and_indices without an end
// frame: the input video's last frames before the window (clean_latents_pre), the newest
// generated frames after it (clean_latents_post; zeros for the first generated section), and
// 2x/4x context from the history's end (the input video's).
func videoContext(s Section, video, hist vol, numClean int) (SectionContext, error) {
	paddings := plan.Paddings(s.Total)
	pad := paddings[s.Index]
	isStart := pad == 0         // the last generated section: the start of the generated video
	isEnd := pad == paddings[0] // the first generated section: next to nothing generated yet
	padSize, w := pad*s.Window, s.Window
	available := hist.T
	if isStart {
		available = video.T
	}
	effective := 1
	if numClean > 1 {
		effective = numClean - 1
	}
	if isStart {
		effective = 1 // avoid jump cuts if the input video is too different
	}
	pre := effective
	n2 := 1
	if available > pre+1 {
		n2 = min(2, max(1, available-pre-1))
	}
	n4 := 1
	if available > pre+n2 {
		n4 = min(16, max(1, available-pre-n2))
	}
	context := min(n2+n4, available-pre)
	post := effective
	// indices: [pre | blank padding | window | post | 2x | 4x]
	idx := plan.Indices{
		Latent:  seq(pre+padSize, w),
		Clean:   append(seq(0, pre), seq(pre+padSize+w, post)...),
		Clean2x: seq(pre+padSize+w+post, n2),
		Clean4x: seq(pre+padSize+w+post+n2, n4),
	}
	// context_frames = history[:, :, -(context + pre):-pre] (history[:, :, :1] without context)
	var c4, c2 vol
	ctx := sliceT(hist, 0, min(1, hist.T))
	if context > 0 {
		ctx = sliceT(hist, max(hist.T-(context+pre), 0), max(hist.T-pre, 0))
	}
	if ctx.T >= n4+n2 {
		c4, c2 = sliceT(ctx, 0, n4), sliceT(ctx, n4, n4+n2)
	} else {
		c4, c2 = sliceT(hist, 0, 1), sliceT(hist, 0, 1)
	}
	cleanPre := tailT(video, min(effective, video.T))
	cleanPost := sliceT(hist, 0, min(effective, hist.T))
	if isEnd {
		cleanPost = zeros(video.B, video.C, 1, video.H, video.W)
	}
	var err error
	if cleanPre, err = repeatT(cleanPre, pre); err != nil {
		return SectionContext{}, err
	}
	if cleanPost, err = repeatT(cleanPost, post); err != nil {
		return SectionContext{}, err
	}
	clean, err := concatT(cleanPre, cleanPost)
	if err != nil {
		return SectionContext{}, fmt.Errorf("clean latents: %w", err)
	}
	return SectionContext{Indices: idx, Clean: clean, Clean2x: c2, Clean4x: c4}, nil
}

// videoF1Context is VideoF1ModelGenerator.video_f1_prepare_clean_latents_and_indices: the input
// video's last latent as the start, and 4x/2x/1x context from the end of the history (the input
// video, then what was generated after it). Configurations where the reference's clean latents
// and their indices disagree in length (its "<=1 sec" edge cases: fewer than 3 latent frames, or
// num_cleaned_frames 1) are refused: the reference's transformer cannot run them either.
func videoF1Context(s Section, video, hist vol, numClean int) (SectionContext, error) {
	w := s.Window
	start := tailT(video, 1)
	available := hist.T
	maxPixelFrames := min(w*4-3, available*4)
	adjusted := max(1, (maxPixelFrames+3)/4)
	effective := 0
	if numClean > 1 {
		effective = numClean - 1
	}
	if available > 2 {
		effective = min(effective, available-2)
	} else {
		effective = 0
	}
	if effective == 0 || adjusted != w {
		return SectionContext{}, fmt.Errorf("%w: video F1 needs at least %d latent frames of history (the input video gives %d) and video_context_frames of 2 or more",
			errBadInput, max(w, 3), video.T)
	}
	n2 := 0
	if available > effective+1 {
		n2 = min(2, max(1, available-effective-1))
	}
	n4 := 0
	if available > effective+n2 {
		n4 = min(16, max(1, available-effective-n2))
	}
	context := min(n4+n2+effective, available)
	// indices: [1 start | 4x | 2x | 1x | window]
	idx := plan.Indices{
		Clean4x: seq(1, n4),
		Clean2x: seq(1+n4, n2),
		Clean:   append([]int64{0}, seq(1+n4+n2, effective)...),
		Latent:  seq(1+n4+n2+effective, adjusted),
	}
	// With effective ≥ 1 the reference's counts give n4 ≥ 1 and n2 ≥ 1, so its fallbacks
	// (history[:, :, :2]) never run. It pads a 1-frame 4x or 2x context to 2 frames by repeating
	// it while its indices keep 1 entry; the transformer replicate-pads both to the kernel's
	// frames (pad_for_3d_conv), so [c] and [c, c] embed alike: the context is passed unpadded,
	// with as many frames as indices.
	ctx := tailT(hist, context)
	c4 := sliceT(ctx, 0, n4)
	c2 := sliceT(ctx, n4, n4+n2)
	c1 := sliceT(ctx, n4+n2, n4+n2+effective)
	clean, err := concatT(start, c1)
	if err != nil {
		return SectionContext{}, fmt.Errorf("clean latents: %w", err)
	}
	return SectionContext{Indices: idx, Clean: clean, Clean2x: c2, Clean4x: c4}, nil
}
