package causalvae

import (
	"encoding/json"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sort"
)

// ClassName is the diffusers class this package implements.
const ClassName = "AutoencoderKLHunyuanVideo"

// Block type names a config may use (the only ones diffusers accepts).
const (
	DownBlockType = "HunyuanVideoDownBlock3D"
	UpBlockType   = "HunyuanVideoUpBlock3D"
)

// Config is the model's config.json (diffusers' AutoencoderKLHunyuanVideo register_to_config
// arguments). Absent keys take diffusers' defaults (the released HunyuanVideo VAE).
type Config struct {
	ClassName                string   `json:"_class_name"`
	InChannels               int      `json:"in_channels"`
	OutChannels              int      `json:"out_channels"`
	LatentChannels           int      `json:"latent_channels"`
	DownBlockTypes           []string `json:"down_block_types"`
	UpBlockTypes             []string `json:"up_block_types"`
	BlockOutChannels         []int    `json:"block_out_channels"`
	LayersPerBlock           int      `json:"layers_per_block"`
	ActFn                    string   `json:"act_fn"`
	NormNumGroups            int      `json:"norm_num_groups"`
	ScalingFactor            float64  `json:"scaling_factor"`
	SpatialCompressionRatio  int      `json:"spatial_compression_ratio"`
	TemporalCompressionRatio int      `json:"temporal_compression_ratio"`
	MidBlockAddAttention     bool     `json:"mid_block_add_attention"`
}

// DefaultConfig returns diffusers' defaults (block_out_channels 128/256/512/512, 16 latent
// channels, ×8 spatial and ×4 temporal compression).
func DefaultConfig() Config {
	four := func(s string) []string { return []string{s, s, s, s} }
	return Config{
		ClassName:                ClassName,
		InChannels:               3,
		OutChannels:              3,
		LatentChannels:           16,
		DownBlockTypes:           four(DownBlockType),
		UpBlockTypes:             four(UpBlockType),
		BlockOutChannels:         []int{128, 256, 512, 512},
		LayersPerBlock:           2,
		ActFn:                    "silu",
		NormNumGroups:            32,
		ScalingFactor:            0.476986,
		SpatialCompressionRatio:  8,
		TemporalCompressionRatio: 4,
		MidBlockAddAttention:     true,
	}
}

// knownConfigKeys are the keys Config reads plus diffusers' bookkeeping keys.
var knownConfigKeys = map[string]bool{
	"_class_name": true, "_diffusers_version": true, "_name_or_path": true,
	"in_channels": true, "out_channels": true, "latent_channels": true,
	"down_block_types": true, "up_block_types": true, "block_out_channels": true,
	"layers_per_block": true, "act_fn": true, "norm_num_groups": true, "scaling_factor": true,
	"spatial_compression_ratio": true, "temporal_compression_ratio": true,
	"mid_block_add_attention": true,
}

// ParseConfig decodes a config.json over diffusers' defaults and validates it. It also returns
// the keys it does not know (diffusers would pass them to __init__ and fail, or ignore them
// when they start with "_"); callers log them.
func ParseConfig(raw []byte) (Config, []string, error) {
	cfg := DefaultConfig()
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return Config{}, nil, fmt.Errorf("parse config: %w", err)
	}
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(raw, &keys); err != nil {
		return Config{}, nil, fmt.Errorf("parse config: %w", err)
	}
	var unknown []string
	for k := range keys {
		if !knownConfigKeys[k] {
			unknown = append(unknown, k)
		}
	}
	sort.Strings(unknown)
	for _, k := range unknown {
		if k == "" || k[0] != '_' {
			return Config{}, unknown, fmt.Errorf("config: unsupported key %q", k)
		}
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, unknown, err
	}
	return cfg, unknown, nil
}

// LoadConfig reads and validates dir/config.json.
func LoadConfig(dir string) (Config, []string, error) {
	path := filepath.Join(dir, "config.json")
	raw, err := os.ReadFile(path)
	if err != nil {
		return Config{}, nil, fmt.Errorf("read config: %w", err)
	}
	cfg, unknown, err := ParseConfig(raw)
	if err != nil {
		return Config{}, unknown, fmt.Errorf("%s: %w", path, err)
	}
	return cfg, unknown, nil
}

// Validate refuses what this implementation (or diffusers itself) cannot build.
func (c Config) Validate() error {
	if c.ClassName != "" && c.ClassName != ClassName {
		return fmt.Errorf("config: _class_name %q is not %s", c.ClassName, ClassName)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"in_channels", c.InChannels}, {"out_channels", c.OutChannels}, {"latent_channels", c.LatentChannels},
		{"layers_per_block", c.LayersPerBlock}, {"norm_num_groups", c.NormNumGroups}} {
		if f.v < 1 {
			return fmt.Errorf("config: %s (%d) must be at least 1", f.name, f.v)
		}
	}
	n := len(c.BlockOutChannels)
	if n == 0 {
		return fmt.Errorf("config: block_out_channels is empty")
	}
	if len(c.DownBlockTypes) != n || len(c.UpBlockTypes) != n {
		return fmt.Errorf("config: %d down_block_types and %d up_block_types for %d block_out_channels",
			len(c.DownBlockTypes), len(c.UpBlockTypes), n)
	}
	for i, t := range c.DownBlockTypes {
		if t != DownBlockType {
			return fmt.Errorf("config: down_block_types[%d] %q is not supported (only %s)", i, t, DownBlockType)
		}
	}
	for i, t := range c.UpBlockTypes {
		if t != UpBlockType {
			return fmt.Errorf("config: up_block_types[%d] %q is not supported (only %s)", i, t, UpBlockType)
		}
	}
	for i, ch := range c.BlockOutChannels {
		if ch < 1 {
			return fmt.Errorf("config: block_out_channels[%d] (%d) must be at least 1", i, ch)
		}
		if ch%c.NormNumGroups != 0 {
			return fmt.Errorf("config: block_out_channels[%d] (%d) must be divisible by norm_num_groups (%d)",
				i, ch, c.NormNumGroups)
		}
	}
	if c.ActFn != "silu" && c.ActFn != "swish" {
		return fmt.Errorf("config: act_fn %q is not supported (only silu)", c.ActFn)
	}
	if !(c.ScalingFactor > 0) {
		return fmt.Errorf("config: scaling_factor (%g) must be positive", c.ScalingFactor)
	}
	if c.TemporalCompressionRatio != 4 {
		// diffusers' decoder raises for anything else
		return fmt.Errorf("config: temporal_compression_ratio (%d) is not supported (only 4)", c.TemporalCompressionRatio)
	}
	r := c.SpatialCompressionRatio
	if r < 1 || r&(r-1) != 0 {
		return fmt.Errorf("config: spatial_compression_ratio (%d) must be a power of two", r)
	}
	// The block plan must compress by exactly the declared ratios, or the tiling arithmetic
	// (which uses the ratios) would not match the network.
	var sp, tp int
	for _, b := range c.downPlan() {
		if b.stride[1] == 2 {
			sp++
		}
		if b.stride[0] == 2 {
			tp++
		}
	}
	if 1<<sp != r {
		return fmt.Errorf("config: %d blocks downsample space %d times, not the ×%d of spatial_compression_ratio",
			n, sp, r)
	}
	if 1<<tp != c.TemporalCompressionRatio {
		return fmt.Errorf("config: %d blocks downsample time %d times, not the ×%d of temporal_compression_ratio",
			n, tp, c.TemporalCompressionRatio)
	}
	return nil
}

// blockPlan is one down or up block's shape: channels, resnet count and resampler.
type blockPlan struct {
	in, out int
	layers  int
	// stride is the downsampler's stride or the upsampler's factor (T, H, W); zero when the
	// block has no resampler.
	stride [3]int
}

func (b blockPlan) resampled() bool { return b.stride != [3]int{} }

func log2(n int) int { return bits.Len(uint(n)) - 1 }

// downPlan mirrors HunyuanVideoEncoder3D.__init__ (temporal_compression_ratio 4).
func (c Config) downPlan() []blockPlan {
	n := len(c.BlockOutChannels)
	spatialLayers := log2(c.SpatialCompressionRatio)
	timeLayers := log2(c.TemporalCompressionRatio)
	plan := make([]blockPlan, n)
	out := c.BlockOutChannels[0]
	for i := range n {
		in := out
		out = c.BlockOutChannels[i]
		final := i == n-1
		addSpatial := i < spatialLayers
		addTime := i >= n-1-timeLayers && !final
		plan[i] = blockPlan{in: in, out: out, layers: c.LayersPerBlock}
		if addSpatial || addTime {
			plan[i].stride = [3]int{1, 1, 1}
			if addTime {
				plan[i].stride[0] = 2
			}
			if addSpatial {
				plan[i].stride[1], plan[i].stride[2] = 2, 2
			}
		}
	}
	return plan
}

// upPlan mirrors HunyuanVideoDecoder3D.__init__ (time_compression_ratio 4).
func (c Config) upPlan() []blockPlan {
	n := len(c.BlockOutChannels)
	rev := make([]int, n)
	for i, ch := range c.BlockOutChannels {
		rev[n-1-i] = ch
	}
	spatialLayers := log2(c.SpatialCompressionRatio)
	timeLayers := log2(c.TemporalCompressionRatio)
	plan := make([]blockPlan, n)
	out := rev[0]
	for i := range n {
		in := out
		out = rev[i]
		final := i == n-1
		addSpatial := i < spatialLayers
		addTime := i >= n-1-timeLayers && !final
		plan[i] = blockPlan{in: in, out: out, layers: c.LayersPerBlock + 1}
		if addSpatial || addTime {
			plan[i].stride = [3]int{1, 1, 1}
			if addTime {
				plan[i].stride[0] = 2
			}
			if addSpatial {
				plan[i].stride[1], plan[i].stride[2] = 2, 2
			}
		}
	}
	return plan
}

// EncodedSize returns the latent length of an input axis of n samples: frames for axis 0
// (T), pixels for axes 1 and 2 (H, W). Each stride-2 causal conv maps n to (n−1)/2+1.
func (c Config) EncodedSize(axis, n int) int {
	if n <= 0 {
		return 0
	}
	for _, b := range c.downPlan() {
		if b.resampled() && b.stride[axis] == 2 {
			n = (n-1)/2 + 1
		}
	}
	return n
}

// DecodedSize returns the output length of a latent axis of n samples: the temporal
// upsampler keeps the first frame and doubles the others (n → 2n−1), the spatial one doubles.
func (c Config) DecodedSize(axis, n int) int {
	if n <= 0 {
		return 0
	}
	for _, b := range c.upPlan() {
		if b.resampled() && b.stride[axis] == 2 {
			if axis == 0 {
				n = 2*n - 1
			} else {
				n *= 2
			}
		}
	}
	return n
}
