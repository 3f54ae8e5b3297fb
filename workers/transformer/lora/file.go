// Package lora reads LoRA files for FramePack's packed HunyuanVideo transformer and merges them
// into its weights at load: W += strength · (alpha/rank) · (up @ down), alpha = rank when the
// file has none.
//
// Three naming conventions are told apart by their keys:
//   - diffusers/PEFT: transformer.<module>.lora_A.weight / lora_B.weight;
//   - kohya/musubi-tuner: lora_unet_<module with _ for .>.lora_down.weight / lora_up.weight / alpha;
//   - the original HunyuanVideo names: diffusion_model.double_blocks.N.img_attn_qkv,
//     single_blocks.N.linear1, …; the fused q/k/v and linear1 (q, k, v and the MLP input) are
//     split onto the model's separate weights as diffusers' converter splits them.
//
// A merged model is a WeightSource like a checkpoint (see Merge), so whatever keeps the weights
// (resident, in 16 bits, streamed) keeps the merged ones.
package lora

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// ErrInvalid is wrapped by every error about a LoRA file or spec the user can fix (unknown key,
// shape or rank mismatch, a file that changes nothing).
var ErrInvalid = errors.New("invalid lora")

// Spec names one LoRA file and the strength it is merged with.
type Spec struct {
	Path     string
	Strength float64
}

// Format is the naming convention of a LoRA file, told from its keys.
type Format string

// The formats FramePack users have.
const (
	// FormatPEFT is diffusers/PEFT: transformer.<module>.lora_A/lora_B.
	FormatPEFT Format = "peft"
	// FormatMusubi is kohya/musubi-tuner: lora_unet_<module_with_underscores>.lora_down/lora_up/alpha.
	FormatMusubi Format = "musubi"
	// FormatOriginal is the original HunyuanVideo names (diffusion_model.double_blocks.N.img_attn_qkv, …).
	FormatOriginal Format = "original"
)

// pair is one low-rank update as stored: down [rank, in…], up [out, rank, 1…].
type pair struct {
	key       string // module key as the file spells it (without .lora_A.weight etc.)
	downKey   string
	upKey     string
	format    Format
	module    string // key without its format's prefix
	down, up  []float32
	downShape []int64
	upShape   []int64
	alpha     float64
	hasAlpha  bool
}

func (p *pair) rank() int { return int(p.downShape[0]) }

// scale is alpha/rank, or 1 without alpha.
func (p *pair) scale() float64 {
	if !p.hasAlpha {
		return 1
	}
	return p.alpha / float64(p.rank())
}

// File is a parsed LoRA file: its low-rank pairs, not yet matched to a model.
type File struct {
	Path   string
	Format Format // the format most of its keys use
	pairs  []*pair
}

// Open reads and checks a LoRA file: every tensor must be a lora_A/lora_B (lora_down/lora_up)
// weight or an alpha, each module must have both halves with one rank.
func Open(path string) (*File, error) {
	f, err := safetensors.Open(path)
	if err != nil {
		return nil, fmt.Errorf("lora %s: %w", path, err)
	}
	defer f.Close()
	lf, err := parse(path, f)
	if err != nil {
		return nil, fmt.Errorf("lora %s: %w", path, err)
	}
	return lf, nil
}

func parse(path string, f *safetensors.File) (*File, error) {
	byKey := map[string]*pair{}
	get := func(k string) *pair {
		p := byKey[k]
		if p == nil {
			p = &pair{key: k}
			byKey[k] = p
		}
		return p
	}
	for _, name := range f.Names() {
		module, part, ok := splitKey(name)
		if !ok {
			return nil, fmt.Errorf("%w: key %s is not a LoRA tensor (want <module>.lora_A.weight, .lora_B.weight, .lora_down.weight, .lora_up.weight or .alpha)", ErrInvalid, name)
		}
		info, _ := f.Info(name)
		if !info.DType.IsFloat() {
			return nil, fmt.Errorf("%w: key %s: dtype %s, want a float type", ErrInvalid, name, info.DType)
		}
		v, shape, err := f.Float32(name)
		if err != nil {
			return nil, fmt.Errorf("key %s: %w", name, err)
		}
		p := get(module)
		switch part {
		case "down":
			p.down, p.downShape, p.downKey = v, shape, name
		case "up":
			p.up, p.upShape, p.upKey = v, shape, name
		case "alpha":
			if len(v) != 1 {
				return nil, fmt.Errorf("%w: key %s: alpha has shape %v, want a scalar", ErrInvalid, name, shape)
			}
			if math.IsNaN(float64(v[0])) || math.IsInf(float64(v[0]), 0) {
				return nil, fmt.Errorf("%w: key %s: alpha is %v", ErrInvalid, name, v[0])
			}
			p.alpha, p.hasAlpha = float64(v[0]), true
		}
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	lf := &File{Path: path}
	counts := map[Format]int{}
	for _, k := range keys {
		p := byKey[k]
		switch {
		case p.down == nil:
			return nil, fmt.Errorf("%w: key %s has an up (lora_B) weight but no down (lora_A) weight", ErrInvalid, k)
		case p.up == nil:
			return nil, fmt.Errorf("%w: key %s has a down (lora_A) weight but no up (lora_B) weight", ErrInvalid, k)
		}
		if len(p.downShape) < 2 || len(p.upShape) < 2 {
			return nil, fmt.Errorf("%w: key %s: down %v and up %v must be matrices", ErrInvalid, k, p.downShape, p.upShape)
		}
		if r := p.downShape[0]; r == 0 || p.upShape[1] != r {
			return nil, fmt.Errorf("%w: key %s: rank mismatch: down %v has rank %d, up %v has %d", ErrInvalid, k, p.downShape, r, p.upShape, p.upShape[1])
		}
		for _, d := range p.upShape[2:] {
			if d != 1 {
				return nil, fmt.Errorf("%w: key %s: up %v: only 1×1 convolution ups are supported", ErrInvalid, k, p.upShape)
			}
		}
		p.format, p.module = classifyModule(k)
		counts[p.format]++
		lf.pairs = append(lf.pairs, p)
	}
	if len(lf.pairs) == 0 {
		return nil, fmt.Errorf("%w: no LoRA tensors in the file", ErrInvalid)
	}
	best := 0
	for _, fm := range []Format{FormatPEFT, FormatMusubi, FormatOriginal} {
		if counts[fm] > best {
			lf.Format, best = fm, counts[fm]
		}
	}
	return lf, nil
}

// splitKey splits a tensor name into its module key and which part it is (down, up, alpha).
func splitKey(name string) (module, part string, ok bool) {
	for _, s := range []struct{ suffix, part string }{
		{".lora_A.weight", "down"}, {".lora_down.weight", "down"},
		{".lora_B.weight", "up"}, {".lora_up.weight", "up"},
		{".alpha", "alpha"},
	} {
		if m, found := strings.CutSuffix(name, s.suffix); found && m != "" {
			return m, s.part, true
		}
	}
	return "", "", false
}

// classifyModule tells a module key's format and strips its prefix.
func classifyModule(key string) (Format, string) {
	if m, ok := strings.CutPrefix(key, "lora_unet_"); ok {
		return FormatMusubi, m
	}
	if m, ok := strings.CutPrefix(key, "diffusion_model."); ok {
		return FormatOriginal, m
	}
	for _, prefix := range []string{"base_model.model.", "transformer."} {
		if m, ok := strings.CutPrefix(key, prefix); ok {
			return FormatPEFT, m
		}
	}
	if isOriginalName(key) {
		return FormatOriginal, key
	}
	return FormatPEFT, key
}
