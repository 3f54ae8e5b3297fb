package clip

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/nn"
)

// LegacyEOSTokenID is the eos_token_id of configs written before transformers PR #24773; with it
// the pooled position is the argmax of the ids (CLIP's end token has the highest id).
const LegacyEOSTokenID = 2

// Config is the part of a CLIPTextConfig (config.json) the encoder needs.
type Config struct {
	ModelType             string  `json:"model_type"`
	VocabSize             int     `json:"vocab_size"`
	HiddenSize            int     `json:"hidden_size"`
	IntermediateSize      int     `json:"intermediate_size"`
	NumHiddenLayers       int     `json:"num_hidden_layers"`
	NumAttentionHeads     int     `json:"num_attention_heads"`
	MaxPositionEmbeddings int     `json:"max_position_embeddings"`
	HiddenAct             string  `json:"hidden_act"`     // "": quick_gelu
	LayerNormEps          float64 `json:"layer_norm_eps"` // 0: 1e-5
	EOSTokenID            *int    `json:"eos_token_id"`   // nil: 49407

	// TextConfig is the text part of a full CLIPConfig (model_type "clip"), used in its place.
	TextConfig *Config `json:"text_config"`
}

// LoadConfig reads and validates dir/config.json (a CLIPTextConfig, or a CLIPConfig whose
// text_config is used).
func LoadConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("clip config: %w", err)
	}
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return Config{}, fmt.Errorf("clip config %s: %w", path, err)
	}
	if c.TextConfig != nil {
		c = *c.TextConfig
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("clip config %s: %w", path, err)
	}
	return c, nil
}

// Validate checks the config and fills defaults (hidden_act, layer_norm_eps, eos_token_id).
func (c *Config) Validate() error {
	if c.ModelType != "" && c.ModelType != "clip_text_model" {
		return fmt.Errorf("model_type %q is not clip_text_model", c.ModelType)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers}, {"num_attention_heads", c.NumAttentionHeads},
		{"max_position_embeddings", c.MaxPositionEmbeddings}} {
		if f.v <= 0 {
			return fmt.Errorf("%s (%d) must be positive", f.name, f.v)
		}
	}
	if c.HiddenSize%c.NumAttentionHeads != 0 {
		return fmt.Errorf("hidden_size (%d) must be divisible by num_attention_heads (%d)", c.HiddenSize, c.NumAttentionHeads)
	}
	if c.HiddenAct == "" {
		c.HiddenAct = "quick_gelu"
	}
	if _, err := nn.ActivationByName(c.HiddenAct); err != nil {
		return err
	}
	if c.LayerNormEps == 0 {
		c.LayerNormEps = 1e-5
	}
	if c.LayerNormEps < 0 {
		return fmt.Errorf("layer_norm_eps (%g) must not be negative", c.LayerNormEps)
	}
	if c.EOSTokenID == nil {
		eos := 49407 // CLIPTextConfig's default
		c.EOSTokenID = &eos
	}
	return nil
}

// PoolIndex returns the position CLIPTextTransformer pools for ids, as transformers does:
// with the legacy eos_token_id 2 the first position of the highest id (torch.argmax), otherwise
// the first position holding eos_token_id (0 when there is none, as argmax of all zeros).
func (c Config) PoolIndex(ids []int32) int {
	best := 0
	if *c.EOSTokenID == LegacyEOSTokenID {
		for i, id := range ids {
			if id > ids[best] {
				best = i
			}
		}
		return best
	}
	for i, id := range ids {
		if int(id) == *c.EOSTokenID {
			return i
		}
	}
	return 0
}
