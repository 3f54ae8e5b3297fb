package pipeline

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// Files of a job's history directory (jobs.Dir.History()).
const (
	// ConditioningFile holds what the encoders produced (written once, before section 0).
	ConditioningFile = "conditioning.safetensors"
	// sectionFilePattern is the history after a section: latents, pixels, generator state.
	sectionFilePattern = "section-%03d.safetensors"
	// StagesFile is the per-stage measurements of the job, one JSON object a line.
	StagesFile = "stages.jsonl"
)

// Checkpoint file keys (jobs.Checkpoint.Files).
const (
	cpConditioning = "conditioning"
	cpSection      = "section"
	// cpParts is the parts file of the video so far; cpSegment+name each of its segments.
	cpParts   = "parts"
	cpSegment = "segment:"
)

// Tensor names of the conditioning file and of the transformer's conditioning segment.
const (
	tLlamaVec    = "llama_vec"
	tLlamaMask   = "llama_mask"
	tClipPooler  = "clip_pooler"
	tLlamaVecN   = "llama_vec_n"
	tLlamaMaskN  = "llama_mask_n"
	tClipPoolerN = "clip_pooler_n"
	tImageHidden = "image_embeddings"
	tStartLatent = "start_latent"
	tImageNP     = "image_np"
	tEndLatent   = "end_latent"
	tEndNP       = "end_np"
)

// Tensor names of a section file.
const (
	tHistoryLatents = "history_latents"
	tHistoryPixels  = "history_pixels"
	tGenerator      = "generator_state"
)

// SectionFile is the history file name of section i.
func SectionFile(i int) string { return fmt.Sprintf(sectionFilePattern, i) }

// conditioning is what the encoders produce once per job.
type conditioning struct {
	// text holds llama_vec, llama_mask, clip_pooler and their negatives, as the text encoder
	// wrote them, then llama_vec.k, llama_mask.k, clip_pooler.k of a timed prompt's text k ≥ 1.
	text []safetensors.Tensor
	// imageHidden is SigLIP's last_hidden_state.
	imageHidden safetensors.Tensor
	// startLatent is the start frame's latent, posterior mean × scaling_factor.
	startLatent vol
	// imageNP is the bucketed start frame, uint8 [H, W, 3].
	imageNP       []byte
	height, width int
	// endLatent is the end frame's latent (posterior mean × scaling_factor, before
	// endStrength), nil when the job has no end frame; endNP is the end frame resized and
	// cropped to the start frame's bucket, uint8 [H, W, 3].
	endLatent   *vol
	endNP       []byte
	endStrength float32
	// keyframes are the job's keyframes (keyframes.go), nil without.
	keyframes []keyframe
	// videoLatents are the input video's latents × scaling_factor of a job that extends a video
	// (video.go), nil else; inputFrames its frames at 30 fps fitted to the bucket, kept for the
	// output (empty when the output leaves them out); videoFrames its decoded frame count.
	videoLatents *vol
	inputFrames  []byte
	videoFrames  int
	// scalingFactor is the VAE's scaling_factor as its worker reported it at encode
	// (LoadResponse.vae); scalingFactorStr prints it in the conditioning file.
	scalingFactor    float32
	scalingFactorStr string
}

// endFrame is the end frame's latent as the history takes it (× its strength), nil without
// one.
func (c *conditioning) endFrame() *vol {
	if c.endLatent == nil {
		return nil
	}
	e := scaled(*c.endLatent, c.endStrength)
	return &e
}

// transformerTensors are the conditioning tensors the transformer reads.
func (c *conditioning) transformerTensors() []safetensors.Tensor {
	return append(append([]safetensors.Tensor(nil), c.text...), c.imageHidden)
}

// save writes the conditioning file (atomically: "*.partial", then renamed).
func (c *conditioning) save(path string) error {
	ts := c.transformerTensors()
	ts = append(ts, f32Tensor(tStartLatent, c.startLatent),
		safetensors.FromUint8(tImageNP, []int64{int64(c.height), int64(c.width), 3}, c.imageNP))
	meta := map[string]string{"height": strconv.Itoa(c.height), "width": strconv.Itoa(c.width), "scaling_factor": c.scalingFactorStr}
	if c.endLatent != nil {
		ts = append(ts, f32Tensor(tEndLatent, *c.endLatent),
			safetensors.FromUint8(tEndNP, []int64{int64(c.height), int64(c.width), 3}, c.endNP))
		meta["end_strength"] = strconv.FormatFloat(float64(c.endStrength), 'g', -1, 32)
	}
	ts = append(ts, c.keyframeTensors(meta)...)
	ts = append(ts, c.videoTensors(meta)...)
	if err := safetensors.WriteFile(path, ts, safetensors.WriteOptions{Metadata: meta}); err != nil {
		return fmt.Errorf("save conditioning: %w", err)
	}
	return nil
}

// loadConditioning reads a conditioning file.
func loadConditioning(path string) (*conditioning, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load conditioning: %w", err)
	}
	defer f.Close()
	c := &conditioning{}
	names := []string{tLlamaVec, tLlamaMask, tClipPooler, tLlamaVecN, tLlamaMaskN, tClipPoolerN}
	for k := 1; ; k++ { // a timed prompt's other texts
		if _, ok := f.Info(promptTensor(tLlamaVec, k)); !ok {
			break
		}
		names = append(names, promptTensor(tLlamaVec, k), promptTensor(tLlamaMask, k), promptTensor(tClipPooler, k))
	}
	for _, name := range names {
		t, err := readRaw(f, name)
		if err != nil {
			return nil, fmt.Errorf("load conditioning: %w", err)
		}
		c.text = append(c.text, t)
	}
	if c.imageHidden, err = readRaw(f, tImageHidden); err != nil {
		return nil, fmt.Errorf("load conditioning: %w", err)
	}
	if c.startLatent, err = readVol(f, tStartLatent); err != nil {
		return nil, fmt.Errorf("load conditioning: %w", err)
	}
	img, err := readRaw(f, tImageNP)
	if err != nil {
		return nil, fmt.Errorf("load conditioning: %w", err)
	}
	if img.DType != safetensors.U8 || len(img.Shape) != 3 || img.Shape[2] != 3 {
		return nil, fmt.Errorf("load conditioning: image_np is %s%v, want U8 [H, W, 3]", img.DType, img.Shape)
	}
	c.imageNP, c.height, c.width = img.Data, int(img.Shape[0]), int(img.Shape[1])
	c.scalingFactorStr = f.Metadata()["scaling_factor"]
	if c.scalingFactor, err = parseScalingFactor(c.scalingFactorStr); err != nil {
		return nil, fmt.Errorf("load conditioning: %w", err)
	}
	if _, ok := f.Info(tEndLatent); ok {
		end, err := readVol(f, tEndLatent)
		if err != nil {
			return nil, fmt.Errorf("load conditioning: %w", err)
		}
		st, err := strconv.ParseFloat(f.Metadata()["end_strength"], 32)
		if err != nil || st < 0 || st > 1 {
			return nil, fmt.Errorf("load conditioning: end_strength %q: want 0 to 1", f.Metadata()["end_strength"])
		}
		np, err := readRaw(f, tEndNP)
		if err != nil {
			return nil, fmt.Errorf("load conditioning: %w", err)
		}
		c.endLatent, c.endStrength, c.endNP = &end, float32(st), np.Data
	}
	if err := c.loadKeyframes(f); err != nil {
		return nil, fmt.Errorf("load conditioning: %w", err)
	}
	if err := c.loadVideo(f); err != nil {
		return nil, fmt.Errorf("load conditioning: %w", err)
	}
	return c, nil
}

// history is the section loop's state after a finished section: what a resume needs, and no
// more unless the runner keeps every section's history (Config.KeepSectionHistory), so that a
// job's memory and its checkpoints do not grow with its length.
type history struct {
	// section is the last finished section (-1 before the first).
	section int
	// latents is history_latents (for i2v the generated latents, newest first, then the 19
	// zero frames the reference starts with): the frames at the end the history grows from
	// that later sections read (retain), or all of them.
	latents vol
	// totalGenerated is total_generated_latent_frames.
	totalGenerated int
	// pixels is history_pixels: the frames the next section blends with (none after the last
	// section), or all of them; nil before the first section.
	pixels *vol
	// generator is the torch generator's state after the section's noise.
	generator []byte
	// segments are the video's final segments so far, in time order (paths relative to the
	// video folder), and frames their number of frames.
	segments []string
	frames   int
}

// save writes the section file (atomically): the latents, the generator, the segment list,
// and the pixels when withPixels (every section's whole history kept): otherwise a resume
// decodes the pending ones again from the latents (restorePending), which costs one decode
// once instead of the frames' float bytes after every section.
func (h *history) save(path string, withPixels bool) error {
	if h.pixels == nil {
		return errors.New("save history: no pixels")
	}
	ts := []safetensors.Tensor{
		f32Tensor(tHistoryLatents, h.latents),
		safetensors.FromUint8(tGenerator, []int64{int64(len(h.generator))}, h.generator),
	}
	if withPixels && h.pixels.T > 0 {
		ts = append(ts, f32Tensor(tHistoryPixels, *h.pixels))
	}
	segs, err := json.Marshal(h.segments)
	if err != nil {
		return fmt.Errorf("save history: %w", err)
	}
	meta := map[string]string{"section": strconv.Itoa(h.section), "total_generated_latent_frames": strconv.Itoa(h.totalGenerated),
		"segments": string(segs), "frames": strconv.Itoa(h.frames)}
	if err := safetensors.WriteFile(path, ts, safetensors.WriteOptions{Metadata: meta}); err != nil {
		return fmt.Errorf("save history: %w", err)
	}
	return nil
}

// loadHistory reads a section file.
func loadHistory(path string) (*history, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load history: %w", err)
	}
	defer f.Close()
	h := &history{}
	md := f.Metadata()
	if h.section, err = strconv.Atoi(md["section"]); err != nil {
		return nil, fmt.Errorf("load history %s: metadata section: %w", filepath.Base(path), err)
	}
	if h.totalGenerated, err = strconv.Atoi(md["total_generated_latent_frames"]); err != nil {
		return nil, fmt.Errorf("load history %s: metadata total_generated_latent_frames: %w", filepath.Base(path), err)
	}
	if h.latents, err = readVol(f, tHistoryLatents); err != nil {
		return nil, fmt.Errorf("load history: %w", err)
	}
	if _, ok := f.Info(tHistoryPixels); ok { // else restorePending decodes them
		px, err := readVol(f, tHistoryPixels)
		if err != nil {
			return nil, fmt.Errorf("load history: %w", err)
		}
		h.pixels = &px
	}
	if raw := md["segments"]; raw != "" {
		if err := json.Unmarshal([]byte(raw), &h.segments); err != nil {
			return nil, fmt.Errorf("load history %s: metadata segments: %w", filepath.Base(path), err)
		}
		if h.frames, err = strconv.Atoi(md["frames"]); err != nil {
			return nil, fmt.Errorf("load history %s: metadata frames: %w", filepath.Base(path), err)
		}
	}
	g, err := readRaw(f, tGenerator)
	if err != nil {
		return nil, fmt.Errorf("load history: %w", err)
	}
	h.generator = g.Data
	if h.totalGenerated < 1 || h.latents.T < 1 {
		return nil, fmt.Errorf("load history %s: %d generated frames of %d", filepath.Base(path), h.totalGenerated, h.latents.T)
	}
	return h, nil
}
