package pipeline

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/framepackd/framepackd/internal/imageproc"
	"github.com/framepackd/framepackd/internal/safetensors"
	"github.com/framepackd/framepackd/supervisor/pipeline/plan"
)

// keyframe is one of a job's keyframes (JobSpec.keyframes, FramePack-eichi's section images):
// the section it belongs to (video time), its image fitted to the start frame's bucket and its
// latent (posterior mean × scaling_factor).
type keyframe struct {
	section int
	np      []byte
	latent  vol
}

// Tensor names of the keyframes in the conditioning file: <base>.<i>, i in JobSpec.keyframes'
// order; the metadata keyframe_sections lists their sections.
const (
	tKeyframeLatent = "keyframe_latent"
	tKeyframeNP     = "keyframe_np"
	mdKeyframes     = "keyframe_sections"
)

// prepareKeyframes decodes the job's keyframe images and fits each to bucket b, as the end frame
// is (FramePack-Studio resizes its end frame to the start frame's bucket; eichi buckets each image
// by its own size, the same bucket for images of the start frame's shape).
func (j *jobRun) prepareKeyframes(c *conditioning, b imageproc.Bucket) error {
	paths := j.job.KeyframePaths
	spec := j.job.Spec
	if len(paths) != len(spec.GetKeyframes()) {
		return fmt.Errorf("%w: the spec has %d keyframes, the job %d keyframe images", errBadInput, len(spec.GetKeyframes()), len(paths))
	}
	if len(paths) == 0 {
		return nil
	}
	if j.variant.Name() != VariantI2V {
		return fmt.Errorf("%w: the %s variant takes no keyframes", errBadInput, j.variant.Name())
	}
	sections, err := plan.KeyframeSections(spec)
	if err != nil {
		return fmt.Errorf("%w: %w", errBadInput, err)
	}
	for i, p := range paths {
		img, _, err := imageproc.DecodeFile(p, imageproc.Options{MaxPixels: j.r.cfg.MaxImagePixels})
		if err != nil {
			return fmt.Errorf("%w: keyframe %d: %w", errBadInput, i, err)
		}
		np, err := imageproc.ResizeAndCenterCrop(img, b.Width, b.Height)
		if err != nil {
			return fmt.Errorf("%w: resize keyframe %d: %w", errBadInput, i, err)
		}
		c.keyframes = append(c.keyframes, keyframe{section: sections[i], np: np.Pix})
	}
	j.log.WithField("sections", fmt.Sprint(sections)).Info("keyframes prepared")
	return nil
}

// extraFrames are the frames the VAE encodes after the start frame, in the same run: the end
// frame, then the keyframes.
func (c *conditioning) extraFrames() []vol {
	img := func(np []byte) vol {
		return imageproc.ImageToVideo(&imageproc.Image{Width: c.width, Height: c.height, Pix: np})
	}
	var out []vol
	if c.endNP != nil {
		out = append(out, img(c.endNP))
	}
	for _, k := range c.keyframes {
		out = append(out, img(k.np))
	}
	return out
}

// setExtraLatents takes the latents of extraFrames, sample b of the encode being latent(b).
func (c *conditioning) setExtraLatents(latent func(b int) vol) {
	b := 1
	if c.endNP != nil {
		end := latent(b)
		c.endLatent = &end
		b++
	}
	for i := range c.keyframes {
		c.keyframes[i].latent = latent(b)
		b++
	}
}

// anchor is the latent section s samples with as its start-side clean latent: the keyframe of
// the latest keyed section at or before its time (plan.KeyframeAnchors), else the start latent.
func (c *conditioning) anchor(v Variant, s Section) vol {
	if len(c.keyframes) == 0 {
		return c.startLatent
	}
	sections := make([]int, len(c.keyframes))
	for i, k := range c.keyframes {
		sections[i] = k.section
	}
	if i := plan.KeyframeAnchors(sections, s.Total)[v.TimeIndex(s)]; i >= 0 {
		return c.keyframes[i].latent
	}
	return c.startLatent
}

// keyframeTensors are the keyframes' tensors and metadata for the conditioning file.
func (c *conditioning) keyframeTensors(meta map[string]string) []safetensors.Tensor {
	if len(c.keyframes) == 0 {
		return nil
	}
	var ts []safetensors.Tensor
	var sections []string
	for i, k := range c.keyframes {
		ts = append(ts, f32Tensor(fmt.Sprintf("%s.%d", tKeyframeLatent, i), k.latent),
			safetensors.FromUint8(fmt.Sprintf("%s.%d", tKeyframeNP, i), []int64{int64(c.height), int64(c.width), 3}, k.np))
		sections = append(sections, strconv.Itoa(k.section))
	}
	meta[mdKeyframes] = strings.Join(sections, ",")
	return ts
}

// loadKeyframes reads the keyframes of a conditioning file.
func (c *conditioning) loadKeyframes(f *safetensors.File) error {
	list := f.Metadata()[mdKeyframes]
	if list == "" {
		return nil
	}
	for i, s := range strings.Split(list, ",") {
		sec, err := strconv.Atoi(s)
		if err != nil || sec < 0 {
			return fmt.Errorf("keyframe_sections %q: want section numbers", list)
		}
		lat, err := readVol(f, fmt.Sprintf("%s.%d", tKeyframeLatent, i))
		if err != nil {
			return err
		}
		np, err := readRaw(f, fmt.Sprintf("%s.%d", tKeyframeNP, i))
		if err != nil {
			return err
		}
		c.keyframes = append(c.keyframes, keyframe{section: sec, np: np.Data, latent: lat})
	}
	return nil
}
