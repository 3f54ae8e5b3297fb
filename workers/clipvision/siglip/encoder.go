package siglip

import (
	"fmt"

	"github.com/framepackd/framepackd/internal/runtime"
)

// Encoder is one stage of the pipeline: a uint8 image through the SiglipImageProcessor and the
// vision model to last_hidden_state (FramePack's hf_clip_vision_encode).
type Encoder struct {
	Processor *Processor
	Model     *Model
}

// LoadEncoder loads the model from imageEncoderDir (config.json + safetensors) and the
// processor from featureExtractorDir (preprocessor_config.json) with the given backend.
func LoadEncoder(rt *runtime.Runtime, imageEncoderDir, featureExtractorDir string, backend Backend, opts LoadOptions) (*Encoder, error) {
	pc, err := LoadProcessorConfig(featureExtractorDir)
	if err != nil {
		return nil, fmt.Errorf("load siglip encoder: %w", err)
	}
	p, err := NewProcessor(pc, backend)
	if err != nil {
		return nil, fmt.Errorf("load siglip encoder: %w", err)
	}
	m, err := Load(rt, imageEncoderDir, opts)
	if err != nil {
		return nil, fmt.Errorf("load siglip encoder: %w", err)
	}
	if err := checkSizes(pc, m.Config); err != nil {
		m.Free()
		return nil, fmt.Errorf("load siglip encoder: %w", err)
	}
	return &Encoder{Processor: p, Model: m}, nil
}

// Encode preprocesses one HWC uint8 image (see Processor.Preprocess for the channel counts
// accepted) and returns last_hidden_state [1, grid², hidden] with its shape. hook is passed to
// Model.Forward.
func (e *Encoder) Encode(pix []uint8, height, width, channels int, hook func(i int) error) ([]float32, []int, error) {
	pv, err := e.Processor.Preprocess(pix, height, width, channels)
	if err != nil {
		return nil, nil, err
	}
	oh, ow := e.Processor.OutputSize(height, width)
	return e.Model.ForwardHost(pv, []int{1, 3, oh, ow}, hook)
}

// Free frees the model's weights.
func (e *Encoder) Free() { e.Model.Free() }

// checkSizes refuses a processor whose output does not make the model's patch grid (the
// position embeddings are not interpolated, as in transformers without interpolate_pos_encoding).
func checkSizes(pc ProcessorConfig, c Config) error {
	if !pc.DoResize {
		return nil // any input size is passed through; Forward checks each image
	}
	if g := c.GridSize(); pc.Height/c.PatchSize != g || pc.Width/c.PatchSize != g {
		return fmt.Errorf("%w: preprocessor size %dx%d makes a %dx%d patch grid, the model's is %dx%d (image_size %d, patch_size %d)",
			ErrCheckpoint, pc.Height, pc.Width, pc.Height/c.PatchSize, pc.Width/c.PatchSize, g, g, c.ImageSize, c.PatchSize)
	}
	return nil
}
