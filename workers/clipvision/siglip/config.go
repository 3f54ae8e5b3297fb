package siglip

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/nn"
)

// Config is the part of a SiglipVisionConfig (image_encoder/config.json) the encoder needs.
type Config struct {
	ModelType         string  `json:"model_type"`
	HiddenSize        int     `json:"hidden_size"`
	IntermediateSize  int     `json:"intermediate_size"`
	NumHiddenLayers   int     `json:"num_hidden_layers"`
	NumAttentionHeads int     `json:"num_attention_heads"`
	NumChannels       int     `json:"num_channels"` // 0: 3
	ImageSize         int     `json:"image_size"`
	PatchSize         int     `json:"patch_size"`
	HiddenAct         string  `json:"hidden_act"`     // "": gelu_pytorch_tanh
	LayerNormEps      float64 `json:"layer_norm_eps"` // 0: 1e-6

	// VisionConfig is the vision part of a full SiglipConfig (model_type "siglip"), used in its
	// place.
	VisionConfig *Config `json:"vision_config"`
}

// LoadConfig reads and validates dir/config.json (a SiglipVisionConfig, or a SiglipConfig whose
// vision_config is used).
func LoadConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("siglip config: %w", err)
	}
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return Config{}, fmt.Errorf("siglip config %s: %w: %w", path, ErrCheckpoint, err)
	}
	if c.VisionConfig != nil {
		c = *c.VisionConfig
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("siglip config %s: %w: %w", path, ErrCheckpoint, err)
	}
	return c, nil
}

// Validate checks the config and fills the defaults of SiglipVisionConfig (num_channels,
// hidden_act, layer_norm_eps).
func (c *Config) Validate() error {
	if c.ModelType != "" && c.ModelType != "siglip_vision_model" {
		return fmt.Errorf("model_type %q is not siglip_vision_model", c.ModelType)
	}
	if c.NumChannels == 0 {
		c.NumChannels = 3
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers}, {"num_attention_heads", c.NumAttentionHeads},
		{"num_channels", c.NumChannels}, {"image_size", c.ImageSize}, {"patch_size", c.PatchSize}} {
		if f.v <= 0 {
			return fmt.Errorf("%s (%d) must be positive", f.name, f.v)
		}
	}
	if c.HiddenSize%c.NumAttentionHeads != 0 {
		return fmt.Errorf("hidden_size (%d) must be divisible by num_attention_heads (%d)", c.HiddenSize, c.NumAttentionHeads)
	}
	if c.PatchSize > c.ImageSize {
		return fmt.Errorf("patch_size (%d) must not exceed image_size (%d)", c.PatchSize, c.ImageSize)
	}
	if c.HiddenAct == "" {
		c.HiddenAct = "gelu_pytorch_tanh"
	}
	if _, err := nn.ActivationByName(c.HiddenAct); err != nil {
		return err
	}
	if c.LayerNormEps == 0 {
		c.LayerNormEps = 1e-6
	}
	if c.LayerNormEps < 0 {
		return fmt.Errorf("layer_norm_eps (%g) must be positive", c.LayerNormEps)
	}
	return nil
}

// GridSize is the number of patches along each side (image_size // patch_size).
func (c Config) GridSize() int { return c.ImageSize / c.PatchSize }

// NumPatches is the number of tokens of last_hidden_state: GridSize².
func (c Config) NumPatches() int { return c.GridSize() * c.GridSize() }

// HeadDim is hidden_size / num_attention_heads.
func (c Config) HeadDim() int { return c.HiddenSize / c.NumAttentionHeads }
