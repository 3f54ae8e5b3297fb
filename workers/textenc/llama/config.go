package llama

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/framepackd/framepackd/internal/nn"
)

// RopeParameters is transformers 5's rope_parameters (and the legacy rope_scaling) block.
type RopeParameters struct {
	RopeType            string   `json:"rope_type"`
	Type                string   `json:"type"` // legacy spelling of rope_type
	RopeTheta           *float64 `json:"rope_theta"`
	PartialRotaryFactor *float64 `json:"partial_rotary_factor"`
}

// Config is the part of a LlamaConfig (config.json) the encoder needs.
type Config struct {
	ModelType             string          `json:"model_type"`
	VocabSize             int             `json:"vocab_size"`
	HiddenSize            int             `json:"hidden_size"`
	IntermediateSize      int             `json:"intermediate_size"`
	NumHiddenLayers       int             `json:"num_hidden_layers"`
	NumAttentionHeads     int             `json:"num_attention_heads"`
	NumKeyValueHeads      int             `json:"num_key_value_heads"` // 0: same as num_attention_heads
	HeadDim               int             `json:"head_dim"`            // 0: hidden_size / num_attention_heads
	HiddenAct             string          `json:"hidden_act"`          // "": silu
	RMSNormEps            float64         `json:"rms_norm_eps"`        // 0: 1e-6
	AttentionBias         bool            `json:"attention_bias"`
	MLPBias               bool            `json:"mlp_bias"`
	MaxPositionEmbeddings int             `json:"max_position_embeddings"`
	RopeParameters        *RopeParameters `json:"rope_parameters"`
	RopeTheta             *float64        `json:"rope_theta"`   // transformers 4 spelling
	RopeScaling           *RopeParameters `json:"rope_scaling"` // transformers 4 spelling
}

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("llama config: %w", err)
	}
	var c Config
	if err := json.Unmarshal(raw, &c); err != nil {
		return Config{}, fmt.Errorf("llama config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("llama config %s: %w", path, err)
	}
	return c, nil
}

// Validate checks the config and fills defaults (num_key_value_heads, head_dim, hidden_act,
// rms_norm_eps).
func (c *Config) Validate() error {
	if c.ModelType != "" && c.ModelType != "llama" {
		return fmt.Errorf("model_type %q is not llama", c.ModelType)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"vocab_size", c.VocabSize}, {"hidden_size", c.HiddenSize}, {"intermediate_size", c.IntermediateSize},
		{"num_hidden_layers", c.NumHiddenLayers}, {"num_attention_heads", c.NumAttentionHeads}} {
		if f.v <= 0 {
			return fmt.Errorf("%s (%d) must be positive", f.name, f.v)
		}
	}
	if c.NumKeyValueHeads == 0 {
		c.NumKeyValueHeads = c.NumAttentionHeads
	}
	if c.NumKeyValueHeads < 0 || c.NumAttentionHeads%c.NumKeyValueHeads != 0 {
		return fmt.Errorf("num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", c.NumAttentionHeads, c.NumKeyValueHeads)
	}
	if c.HeadDim == 0 {
		if c.HiddenSize%c.NumAttentionHeads != 0 {
			return fmt.Errorf("hidden_size (%d) must be divisible by num_attention_heads (%d)", c.HiddenSize, c.NumAttentionHeads)
		}
		c.HeadDim = c.HiddenSize / c.NumAttentionHeads
	}
	if c.HeadDim < 0 || c.HeadDim%2 != 0 {
		return fmt.Errorf("head_dim (%d) must be positive and even for rotary embeddings", c.HeadDim)
	}
	if c.HiddenAct == "" {
		c.HiddenAct = "silu"
	}
	if _, err := nn.ActivationByName(c.HiddenAct); err != nil {
		return err
	}
	if c.RMSNormEps == 0 {
		c.RMSNormEps = 1e-6
	}
	if c.RMSNormEps < 0 {
		return fmt.Errorf("rms_norm_eps (%g) must not be negative", c.RMSNormEps)
	}
	_, err := c.Rope()
	return err
}

// Rope returns rope_theta after checking that the rotary embedding is the default type
// (rope_parameters, or rope_theta and rope_scaling of older configs).
func (c Config) Rope() (theta float64, err error) {
	theta = 10000 // LlamaConfig's default
	if c.RopeTheta != nil {
		theta = *c.RopeTheta
	}
	for _, p := range []*RopeParameters{c.RopeScaling, c.RopeParameters} {
		if p == nil {
			continue
		}
		typ := p.RopeType
		if typ == "" {
			typ = p.Type
		}
		if typ != "" && typ != "default" {
			return 0, fmt.Errorf("rope type %q is not supported (default only)", typ)
		}
		if p.PartialRotaryFactor != nil && *p.PartialRotaryFactor != 1 {
			return 0, fmt.Errorf("partial_rotary_factor %g is not supported (1 only)", *p.PartialRotaryFactor)
		}
		if p.RopeTheta != nil {
			theta = *p.RopeTheta
		}
	}
	if !(theta > 0) {
		return 0, fmt.Errorf("rope_theta (%g) must be positive", theta)
	}
	return theta, nil
}

// ActivationBytes estimates the activations one forward over tokens positions holds at its
// peak (float32): the residual stream, the normed input, q/k/v and the attention output
// (about 8 hidden-wide rows) and the gate, up and product of the MLP (3 intermediate-wide
// rows), plus the causal mask and one head's scores.
func (c Config) ActivationBytes(tokens int) int64 {
	l := int64(tokens)
	return 4 * (l*(8*int64(c.HiddenSize)+3*int64(c.IntermediateSize)) + 2*l*l)
}
