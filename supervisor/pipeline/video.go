package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/internal/safetensors"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
	"github.com/framepackd/framepackd/supervisor/video"
)

// videoEncodeRun is FramePack-Studio's video_encode's vae_batch_size
// (modules/generators/video_base_generator.py): frames encoded in independent runs of 16.
const videoEncodeRun = 16

// Tensor names and metadata of a video job's conditioning file.
const (
	tVideoLatents = "video_latents" // the input video's encoded latents × scaling_factor
	tInputFrames  = "input_frames"  // the input video's frames at 30 fps, fitted to the bucket, U8 [T, H, W, 3]
	mdVideoFrames = "video_frames"  // the input video's decoded frame count
)

// jobVideoVariant is the variant of a job that extends a video: Studio's "Video" for the i2v
// variant, "Video F1" for f1.
func jobVideoVariant(spec *framepackv1.JobSpec) string {
	if spec.GetVariant() == VariantF1 {
		return VariantVideoF1
	}
	return VariantVideo
}

// bindVideo gives a video variant the job's input video latents (from the conditioning).
func (j *jobRun) bindVideo() error {
	vv, ok := j.variant.(videoVariant)
	if !ok {
		return nil
	}
	if j.cond == nil || j.cond.videoLatents == nil {
		return errors.New("the job extends a video but its conditioning holds no video latents")
	}
	j.variant = vv.withVideo(*j.cond.videoLatents, int(j.job.Spec.GetVideoContextFrames()))
	return nil
}

// encodeVideo is the prepare and VAE encode of a job that extends a video, as Studio's
// video_encode does them: the input decoded with ffmpeg, its frames fitted to the bucket of its
// frame size, the last plan.VideoTrimmedFrames of them encoded in independent runs of 16 frames
// (the posterior mean × scaling_factor); the first of them is SigLIP's input, the last latent the
// start latent. With video_include_input the frames at 30 fps are kept for the output.
func (j *jobRun) encodeVideo(ctx context.Context, c *conditioning) error {
	var frames []*imageproc.Image
	if err := j.hostStage(ctx, framepackv1.Stage_STAGE_PREPARE, -1, func() error {
		var err error
		frames, err = j.prepareVideo(ctx, c)
		return err
	}); err != nil {
		return err
	}
	j.cond = c // the frame size is known: the stages below are sized by it
	pixels := zeros(1, 3, len(frames), c.height, c.width)
	n := c.height * c.width
	for t, f := range frames {
		v := imageproc.ImageToVideo(f)
		for ch := range 3 {
			copy(pixels.Data[(ch*len(frames)+t)*n:(ch*len(frames)+t+1)*n], v.Data[ch*n:(ch+1)*n])
		}
	}
	rep, latSeg, err := j.vaeEncode(ctx, "video-pixels", "video-latents", pixels, videoEncodeRun)
	if err != nil {
		return err
	}
	mean, err := readSegmentVol(latSeg, "latents")
	if err == nil && mean.T != len(frames)/4 {
		err = fmt.Errorf("the vae encoded %d frames into %d latent frames, want %d", len(frames), mean.T, len(frames)/4)
	}
	if err == nil {
		c.scalingFactor, c.scalingFactorStr, err = vaeFacts(rep.Loaded, mean, c.height, c.width)
	}
	if err != nil {
		return j.failure(ctx, framepackv1.Stage_STAGE_VAE_ENCODE, -1, j.r.cfg.Now(), 0, err)
	}
	latents := scaled(mean, c.scalingFactor)
	c.videoLatents = &latents
	c.startLatent = sliceT(latents, latents.T-1, latents.T) // worker.py: start_latent = video_latents[:, :, -1:]
	j.dropSegments("video-pixels", "video-latents")
	if j.draining() {
		return jobs.ErrInterrupted
	}
	return nil
}

// prepareVideo decodes the job's input video and returns the frames to encode, fitted to the
// bucket; it fills in the conditioning's size, SigLIP image and (with video_include_input) the
// frames the output starts with.
func (j *jobRun) prepareVideo(ctx context.Context, c *conditioning) ([]*imageproc.Image, error) {
	path := j.job.VideoPath
	bad := func(err error) error {
		if errors.Is(err, video.ErrBadVideo) {
			return fmt.Errorf("%w: input video: %w", errBadInput, err)
		}
		return fmt.Errorf("input video: %w", err)
	}
	info, err := j.r.cfg.Video.Probe(ctx, path)
	if err != nil {
		return nil, bad(err)
	}
	b, err := imageproc.FindNearestBucket(info.Height, info.Width, j.buckets)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errBadInput, err)
	}
	c.height, c.width = b.Height, b.Width
	fit := func(rgb []byte) (*imageproc.Image, error) {
		img, err := imageproc.ResizeAndCenterCrop(&imageproc.Image{Width: info.Width, Height: info.Height, Pix: rgb}, b.Width, b.Height)
		if err != nil {
			return nil, fmt.Errorf("%w: resize a frame: %w", errBadInput, err)
		}
		return img, nil
	}
	include := j.job.Spec.GetVideoIncludeInput()
	at30 := math.Abs(info.FPS-video.FPS) < 0.01
	keep := 4 * plan.VideoContextLatents
	var last []*imageproc.Image // the newest frames, up to keep
	var all []byte              // every frame fitted, for the output (30 fps input)
	n, err := j.r.cfg.Video.Decode(ctx, path, info.Width, info.Height, 0, func(_ int, rgb []byte) error {
		img, err := fit(rgb)
		if err != nil {
			return err
		}
		last = append(last, img)
		if len(last) > keep {
			last = last[1:]
		}
		if include && at30 {
			all = append(all, img.Pix...)
		}
		return nil
	})
	if err != nil {
		return nil, bad(err)
	}
	trimmed := plan.VideoTrimmedFrames(n)
	if trimmed == 0 {
		return nil, fmt.Errorf("%w: input video: %d frames; extending a video needs at least 4", errBadInput, n)
	}
	frames := last[len(last)-trimmed:]
	if j.variant.Name() == VariantVideoF1 {
		if w := j.window; trimmed/4 < max(w, 3) {
			return nil, fmt.Errorf("%w: input video: its last %d frames give %d latent frames; video F1 with latent_window_size %d needs %d (%d frames): use a longer video or a smaller window",
				errBadInput, trimmed, trimmed/4, w, max(w, 3), 4*max(w, 3))
		}
	}
	if include && !at30 {
		// The output's frames are at 30 fps: decode again through ffmpeg's fps filter.
		if _, err := j.r.cfg.Video.Decode(ctx, path, info.Width, info.Height, video.FPS, func(_ int, rgb []byte) error {
			img, err := fit(rgb)
			if err == nil {
				all = append(all, img.Pix...)
			}
			return err
		}); err != nil {
			return nil, bad(err)
		}
	}
	c.imageNP = frames[0].Pix // worker.py: input_image_np = the first trimmed frame
	c.inputFrames, c.videoFrames = all, n
	j.log.WithFields(map[string]any{"video": fmt.Sprintf("%dx%d %s %.3g fps", info.Width, info.Height, info.Codec, info.FPS),
		"frames": n, "encoded": trimmed, "bucket": fmt.Sprintf("%dx%d", b.Width, b.Height), "output_prefix_frames": len(all) / (3 * b.Width * b.Height)}).Info("input video prepared")
	return frames, nil
}

// videoTensors are a video job's tensors and metadata for the conditioning file.
func (c *conditioning) videoTensors(meta map[string]string) []safetensors.Tensor {
	if c.videoLatents == nil {
		return nil
	}
	ts := []safetensors.Tensor{f32Tensor(tVideoLatents, *c.videoLatents)}
	if len(c.inputFrames) > 0 {
		t := len(c.inputFrames) / (3 * c.height * c.width)
		ts = append(ts, safetensors.FromUint8(tInputFrames, []int64{int64(t), int64(c.height), int64(c.width), 3}, c.inputFrames))
	}
	meta[mdVideoFrames] = strconv.Itoa(c.videoFrames)
	return ts
}

// loadVideo reads a video job's tensors of a conditioning file.
func (c *conditioning) loadVideo(f *safetensors.File) error {
	if _, ok := f.Info(tVideoLatents); !ok {
		return nil
	}
	v, err := readVol(f, tVideoLatents)
	if err != nil {
		return err
	}
	c.videoLatents = &v
	if _, ok := f.Info(tInputFrames); ok {
		fr, err := readRaw(f, tInputFrames)
		if err != nil {
			return err
		}
		if fr.DType != safetensors.U8 || len(fr.Shape) != 4 || int(fr.Shape[1]) != c.height || int(fr.Shape[2]) != c.width || fr.Shape[3] != 3 {
			return fmt.Errorf("input_frames is %s%v, want U8 [T, %d, %d, 3]", fr.DType, fr.Shape, c.height, c.width)
		}
		c.inputFrames = fr.Data
	}
	c.videoFrames, _ = strconv.Atoi(f.Metadata()[mdVideoFrames])
	return nil
}

// inputSegmentName is the segment of a video extension's input frames (the video folder's
// segments/).
const inputSegmentName = "input.mp4"

// inputSegment writes, once, the segment of the input video's frames the output starts with
// and returns its path relative to the video folder and its frame count; "" when the job keeps
// none (no input video, or video_include_input false).
func (j *jobRun) inputSegment(ctx context.Context, segDir string) (string, int, error) {
	c := j.cond
	if c == nil || len(c.inputFrames) == 0 {
		return "", 0, nil
	}
	t := len(c.inputFrames) / (3 * c.height * c.width)
	p := filepath.Join(segDir, inputSegmentName)
	for _, have := range []string{p, video.FramesDir(p)} {
		if _, err := os.Stat(have); err == nil {
			return filepath.Join(segmentsDir, filepath.Base(have)), t, nil
		}
	}
	out, err := j.r.cfg.Video.Write(ctx, p, video.Clip{Frames: t, Height: c.height, Width: c.width, RGB: c.inputFrames}, int(j.job.Spec.GetMp4Crf()))
	if err != nil {
		return "", 0, fmt.Errorf("input video segment: %w", err)
	}
	return filepath.Join(segmentsDir, filepath.Base(out.Path)), out.Frames, nil
}
