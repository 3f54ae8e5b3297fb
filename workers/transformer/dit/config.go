package dit

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
)

// ClassName is the diffusers class this package implements (config.json "_class_name").
const ClassName = "HunyuanVideoTransformer3DModelPacked"

// Config is HunyuanVideoTransformer3DModelPacked's config.json. Zero values of a decoded file
// are the reference constructor's defaults where it has them (DefaultConfig).
type Config struct {
	ClassName           string  `json:"_class_name"`
	InChannels          int     `json:"in_channels"`
	OutChannels         int     `json:"out_channels"`
	NumAttentionHeads   int     `json:"num_attention_heads"`
	AttentionHeadDim    int     `json:"attention_head_dim"`
	NumLayers           int     `json:"num_layers"`
	NumSingleLayers     int     `json:"num_single_layers"`
	NumRefinerLayers    int     `json:"num_refiner_layers"`
	MLPRatio            float64 `json:"mlp_ratio"`
	PatchSize           int     `json:"patch_size"`
	PatchSizeT          int     `json:"patch_size_t"`
	QKNorm              string  `json:"qk_norm"`
	GuidanceEmbeds      bool    `json:"guidance_embeds"`
	TextEmbedDim        int     `json:"text_embed_dim"`
	PooledProjectionDim int     `json:"pooled_projection_dim"`
	RopeTheta           float64 `json:"rope_theta"`
	RopeAxesDim         [3]int  `json:"rope_axes_dim"`
	HasImageProj        bool    `json:"has_image_proj"`
	ImageProjDim        int     `json:"image_proj_dim"`
	HasCleanXEmbedder   bool    `json:"has_clean_x_embedder"`
	DiffusersVersion    string  `json:"_diffusers_version,omitempty"`
	NameOrPath          string  `json:"_name_or_path,omitempty"`
}

// DefaultConfig is the reference constructor's defaults (the released FramePack model sets
// has_image_proj and has_clean_x_embedder in its config.json).
func DefaultConfig() Config {
	return Config{
		ClassName: ClassName, InChannels: 16, OutChannels: 16, NumAttentionHeads: 24, AttentionHeadDim: 128,
		NumLayers: 20, NumSingleLayers: 40, NumRefinerLayers: 2, MLPRatio: 4, PatchSize: 2, PatchSizeT: 1,
		QKNorm: "rms_norm", GuidanceEmbeds: true, TextEmbedDim: 4096, PooledProjectionDim: 768,
		RopeTheta: 256, RopeAxesDim: [3]int{16, 56, 56}, ImageProjDim: 1152,
	}
}

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (Config, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read config: %w", err)
	}
	cfg := DefaultConfig()
	cfg.ClassName = ""
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return Config{}, fmt.Errorf("parse %s: %w", path, err)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, nil
}

// InnerDim is the model width: heads × head dim.
func (c Config) InnerDim() int { return c.NumAttentionHeads * c.AttentionHeadDim }

// MLPDim is the feed-forward width, int(inner × mlp_ratio) as the reference computes it.
func (c Config) MLPDim() int { return int(float64(c.InnerDim()) * c.MLPRatio) }

// OutChannelsOrIn is out_channels, or in_channels when it is 0 (the reference's `or`).
func (c Config) OutChannelsOrIn() int {
	if c.OutChannels == 0 {
		return c.InChannels
	}
	return c.OutChannels
}

// cleanInChannels is the clean-latent embedders' input width: the reference hard-codes 16.
const cleanInChannels = 16

// Validate reports the first setting this implementation cannot run, as an error wrapping
// ErrUnsupportedConfig.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrUnsupportedConfig}, args...)...)
	}
	if c.ClassName != "" && c.ClassName != ClassName {
		return bad("_class_name %q, want %q", c.ClassName, ClassName)
	}
	pos := map[string]int{
		"in_channels": c.InChannels, "num_attention_heads": c.NumAttentionHeads,
		"attention_head_dim": c.AttentionHeadDim, "patch_size": c.PatchSize, "text_embed_dim": c.TextEmbedDim,
		"pooled_projection_dim": c.PooledProjectionDim,
	}
	for _, name := range []string{"in_channels", "num_attention_heads", "attention_head_dim", "patch_size",
		"text_embed_dim", "pooled_projection_dim"} {
		if pos[name] <= 0 {
			return bad("%s (%d) must be positive", name, pos[name])
		}
	}
	if c.OutChannels < 0 || c.NumLayers < 0 || c.NumSingleLayers < 0 || c.NumRefinerLayers < 0 {
		return bad("negative out_channels, num_layers, num_single_layers or num_refiner_layers")
	}
	if c.PatchSizeT != 1 {
		return bad("patch_size_t %d is not supported (only 1: the clean-latent embedders and the rope frame indices assume it)", c.PatchSizeT)
	}
	if c.QKNorm != "rms_norm" {
		return bad("qk_norm %q is not supported (only rms_norm)", c.QKNorm)
	}
	if !(c.MLPRatio > 0) || c.MLPDim() <= 0 {
		return bad("mlp_ratio %v gives no feed-forward width", c.MLPRatio)
	}
	if !(c.RopeTheta > 0) {
		return bad("rope_theta %v must be positive", c.RopeTheta)
	}
	sum := 0
	for i, d := range c.RopeAxesDim {
		if d <= 0 || d%2 != 0 {
			return bad("rope_axes_dim[%d] (%d) must be positive and even", i, d)
		}
		sum += d
	}
	if sum != c.AttentionHeadDim {
		return bad("rope_axes_dim %v sums to %d, attention_head_dim is %d", c.RopeAxesDim, sum, c.AttentionHeadDim)
	}
	if c.HasImageProj && c.ImageProjDim <= 0 {
		return bad("image_proj_dim (%d) must be positive", c.ImageProjDim)
	}
	if c.HasCleanXEmbedder {
		if c.InChannels != cleanInChannels {
			return bad("in_channels %d with has_clean_x_embedder: the clean-latent embedders take %d channels", c.InChannels, cleanInChannels)
		}
		if c.PatchSize != 2 {
			return bad("patch_size %d with has_clean_x_embedder: the clean-latent embedders patch by 2", c.PatchSize)
		}
	}
	return nil
}
