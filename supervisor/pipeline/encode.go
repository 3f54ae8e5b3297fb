package pipeline

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/internal/shm"
	"github.com/framepackd/framepackd/internal/workerkit"
	framepackv1 "github.com/framepackd/framepackd/proto/gen/go/framepack/v1"
	"github.com/framepackd/framepackd/supervisor/jobs"
	"github.com/framepackd/framepackd/supervisor/lanes"
)

// encode runs the once-per-job stages (text encode, prepare, VAE encode, image encode) and
// saves their outputs in the conditioning file.
func (j *jobRun) encode(ctx context.Context) error {
	spec := j.job.Spec
	c := &conditioning{}

	// Text encoder: LLaMA hidden_states[-3][:, 95:], CLIP-L pooled; zero negative at cfg 1.
	textSeg, err := j.segment("text")
	if err != nil {
		return err
	}
	ref := func(name string) workerkit.TensorRef { return workerkit.TensorRef{Path: textSeg, Name: name} }
	// A timed prompt's distinct texts are encoded once each, in this one stage: the first as
	// the prompt, the others as extra prompts into tensors named <name>.<k>.
	prompts, err := j.jobPrompts()
	if err != nil {
		return j.failure(ctx, framepackv1.Stage_STAGE_TEXT_ENCODE, -1, j.r.cfg.Now(), 0, err)
	}
	names := []string{tLlamaVec, tLlamaMask, tClipPooler, tLlamaVecN, tLlamaMaskN, tClipPoolerN}
	req := &workerkit.TextEncodeRequest{Prompt: prompts.texts[0], NegativePrompt: spec.GetNegativePrompt(), CFG: spec.GetCfg(),
		LlamaVec: ref(tLlamaVec), LlamaMask: ref(tLlamaMask), ClipPooler: ref(tClipPooler),
		LlamaVecN: ref(tLlamaVecN), LlamaMaskN: ref(tLlamaMaskN), ClipPoolerN: ref(tClipPoolerN)}
	for k := 1; k < len(prompts.texts); k++ {
		x := workerkit.ExtraPrompt{Prompt: prompts.texts[k], LlamaVec: ref(promptTensor(tLlamaVec, k)),
			LlamaMask: ref(promptTensor(tLlamaMask, k)), ClipPooler: ref(promptTensor(tClipPooler, k))}
		req.ExtraPrompts = append(req.ExtraPrompts, x)
		names = append(names, x.LlamaVec.Name, x.LlamaMask.Name, x.ClipPooler.Name)
	}
	tst := lanes.Stage{Model: lanes.TextEnc, ModelDir: j.r.cfg.Models.HunyuanVideo, Request: req, Keep: j.r.cfg.Residency}
	tst.Need = j.need(ctx, tst, 0)
	if _, err = j.workerStage(ctx, framepackv1.Stage_STAGE_TEXT_ENCODE, -1, tst); err != nil {
		return err
	}
	if err := j.readSegment(textSeg, func(m *shm.Mapped) error {
		for _, name := range names {
			t, err := readRaw(m, name)
			if err != nil {
				return err
			}
			c.text = append(c.text, t)
		}
		return nil
	}); err != nil {
		return j.failure(ctx, framepackv1.Stage_STAGE_TEXT_ENCODE, -1, j.r.cfg.Now(), 0, err)
	}
	j.dropSegments("text")
	if j.draining() {
		return jobs.ErrInterrupted
	}

	// The start frame (and end frame, keyframes) or the input video, VAE-encoded.
	if j.job.VideoPath != "" {
		if err := j.encodeVideo(ctx, c); err != nil { // video.go
			return err
		}
	} else if err := j.encodeImages(ctx, c); err != nil {
		return err
	}

	// SigLIP of the bucketed start frame.
	imgSeg, err := j.segment("start-image")
	if err != nil {
		return err
	}
	if _, err := shm.WriteSegment(imgSeg, []safetensors.Tensor{safetensors.FromUint8("image", []int64{int64(c.height), int64(c.width), 3}, c.imageNP)}); err != nil {
		return fmt.Errorf("job %s: start image: %w", j.job.ID, err)
	}
	sigSeg, err := j.segment("siglip")
	if err != nil {
		return err
	}
	sst := lanes.Stage{Model: lanes.ClipVision, ModelDir: j.r.cfg.Models.FluxRedux, Keep: j.r.cfg.Residency,
		Request: &workerkit.ImageEncodeRequest{Image: workerkit.TensorRef{Path: imgSeg, Name: "image"},
			LastHiddenState: workerkit.TensorRef{Path: sigSeg, Name: tImageHidden}},
		Load: workerkit.Override{SiglipProcessor: j.r.cfg.SiglipProcessor}}
	sst.Need = j.need(ctx, sst, 0)
	if _, err := j.workerStage(ctx, framepackv1.Stage_STAGE_IMAGE_ENCODE, -1, sst); err != nil {
		return err
	}
	if err := j.readSegment(sigSeg, func(m *shm.Mapped) error {
		t, err := readRaw(m, tImageHidden)
		c.imageHidden = t
		return err
	}); err != nil {
		return j.failure(ctx, framepackv1.Stage_STAGE_IMAGE_ENCODE, -1, j.r.cfg.Now(), 0, err)
	}
	j.dropSegments("start-image", "siglip")

	if err := c.save(filepath.Join(j.job.Dir.History(), ConditioningFile)); err != nil {
		return fmt.Errorf("job %s: %w", j.job.ID, err)
	}
	j.cond = c
	if j.draining() {
		return jobs.ErrInterrupted
	}
	return nil
}

// readSegment maps a complete segment for fn.
func (j *jobRun) readSegment(path string, fn func(*shm.Mapped) error) error {
	m, err := shm.Open(path)
	if err != nil {
		return err
	}
	defer m.Close()
	return fn(m)
}

// encodeImages prepares the start frame (with the end frame and keyframes) and VAE-encodes them.
func (j *jobRun) encodeImages(ctx context.Context, c *conditioning) error {
	spec := j.job.Spec
	// Prepare: nearest bucket, LANCZOS resize-to-cover + centre crop, [-1, 1].
	var pixels vol
	if err := j.hostStage(ctx, framepackv1.Stage_STAGE_PREPARE, -1, func() error {
		img, _, err := imageproc.DecodeFile(j.job.InputPath, imageproc.Options{MaxPixels: j.r.cfg.MaxImagePixels})
		if err != nil {
			return fmt.Errorf("%w: input image: %w", errBadInput, err)
		}
		b, err := imageproc.FindNearestBucket(img.Height, img.Width, j.buckets)
		if err != nil {
			return fmt.Errorf("%w: %w", errBadInput, err)
		}
		np, err := imageproc.ResizeAndCenterCrop(img, b.Width, b.Height)
		if err != nil {
			return fmt.Errorf("%w: resize: %w", errBadInput, err)
		}
		c.imageNP, c.height, c.width = np.Pix, np.Height, np.Width
		pixels = imageproc.ImageToVideo(np)
		j.log.WithFields(map[string]any{"input": fmt.Sprintf("%dx%d", img.Width, img.Height), "bucket": fmt.Sprintf("%dx%d", b.Width, b.Height)}).Info("start frame prepared")
		if err := j.prepareKeyframes(c, b); err != nil {
			return err
		}
		if j.job.EndImagePath == "" {
			return nil
		}
		// FramePack-Studio's end frame (original_with_endframe_pipeline.py preprocess_inputs):
		// resized and cropped to the start frame's bucket, then VAE-encoded with it.
		end, _, err := imageproc.DecodeFile(j.job.EndImagePath, imageproc.Options{MaxPixels: j.r.cfg.MaxImagePixels})
		if err != nil {
			return fmt.Errorf("%w: end image: %w", errBadInput, err)
		}
		endNP, err := imageproc.ResizeAndCenterCrop(end, b.Width, b.Height)
		if err != nil {
			return fmt.Errorf("%w: resize end image: %w", errBadInput, err)
		}
		c.endNP, c.endStrength = endNP.Pix, spec.GetEndStrength()
		j.log.WithFields(map[string]any{"end": fmt.Sprintf("%dx%d", end.Width, end.Height), "strength": c.endStrength}).Info("end frame prepared")
		return nil
	}); err != nil {
		return err
	}

	j.cond = c // the frame size is known: the stages below are sized by it

	// VAE encode of the start frame (and the end frame and the keyframes, as more samples of
	// the same run): the posterior mean × scaling_factor.
	pixels, err := concatB(append([]vol{pixels}, c.extraFrames()...)...)
	if err != nil {
		return err
	}
	rep, latSeg, err := j.vaeEncode(ctx, "start-pixels", "start-latent", pixels, 0)
	if err != nil {
		return err
	}
	mean, err := readSegmentVol(latSeg, "latents")
	if err == nil && mean.B != pixels.B {
		err = fmt.Errorf("the vae encoded %d images, it was given %d", mean.B, pixels.B)
	}
	if err == nil {
		c.scalingFactor, c.scalingFactorStr, err = vaeFacts(rep.Loaded, mean, c.height, c.width)
	}
	if err != nil {
		return j.failure(ctx, framepackv1.Stage_STAGE_VAE_ENCODE, -1, j.r.cfg.Now(), 0, err)
	}
	c.startLatent = scaled(sampleB(mean, 0), c.scalingFactor)
	c.setExtraLatents(func(b int) vol { return scaled(sampleB(mean, b), c.scalingFactor) })
	j.dropSegments("start-pixels", "start-latent")
	if j.draining() {
		return jobs.ErrInterrupted
	}
	return nil
}

// vaeEncode runs the VAE's encode stage on pixels: written to the job's segment pixName, the
// posterior mean left in segment latName (read and dropped by the caller), frames encoded in
// independent runs of runs frames when it is above 0 (Studio's video_encode). The worker asks
// to be kept with the decodes' estimate: the same worker may serve them.
func (j *jobRun) vaeEncode(ctx context.Context, pixName, latName string, pixels vol, runs uint32) (lanes.Report, string, error) {
	pixSeg, err := j.segment(pixName)
	if err != nil {
		return lanes.Report{}, "", err
	}
	if _, err := shm.WriteSegment(pixSeg, []safetensors.Tensor{f32Tensor("pixels", pixels)}); err != nil {
		return lanes.Report{}, "", fmt.Errorf("job %s: %s: %w", j.job.ID, pixName, err)
	}
	latSeg, err := j.segment(latName)
	if err != nil {
		return lanes.Report{}, "", err
	}
	vst := j.vaeStage(&workerkit.VAEEncodeRequest{Pixels: workerkit.TensorRef{Path: pixSeg, Name: "pixels"}, Tiling: j.vaeTiling(),
		Latents: workerkit.TensorRef{Path: latSeg, Name: "latents"}, IndependentFrames: runs})
	vst.Keep = j.r.cfg.Residency
	vst.Need = j.need(ctx, vst, maxDecodeFrames(j.window))
	rep, err := j.workerStage(ctx, framepackv1.Stage_STAGE_VAE_ENCODE, -1, vst)
	return rep, latSeg, err
}
