// Package fp8 reads the single-file 8-bit float checkpoints users have, as they have them: it
// tells the format from the tensors' names and dtypes (Detect) and says, for every 8-bit weight,
// how it dequantizes (Weight). The nn loader binds such a weight as it is stored, with its scales,
// for the runtime's fp8 GEMM (runtime.LinearQ).
//
// The formats and their rules (q is the stored 8-bit value, float8_e4m3fn or float8_e5m2, widened
// exactly; s, t the stored scales; every other tensor is used as stored, in 16 or 32 bits):
//
//   - Plain: weights cast to float8 with no scale (Kijai's FramePackI2V_HY_fp8_e4m3fn and
//     _e5m2 files: the blocks' Linear weights in fp8; norms, biases, modulation and the
//     embedders in 16 bits). w = q. No scale tensor and no marker.
//   - Comfy: ComfyUI's "scaled fp8" (comfy/ops.py scaled_fp8_ops; comfy/utils.py's legacy
//     conversion): a marker tensor "scaled_fp8" (usually empty; its dtype is the fp8 type, F32
//     meaning e4m3fn), and per Linear "<m>.scale_weight", one float32 (0-d or [1]), and optionally
//     "<m>.scale_input", one float32 (the static activation scale of ComfyUI's fp8 matmul). w = q·s.
//     An fp8 weight without scale_weight has s = 1 (ComfyUI's default parameter). scale_input is
//     checked but not used: the fp8 × fp8 path here scales activations dynamically (per tensor or
//     per token), which covers what a static scale gives.
//   - Musubi: musubi-tuner's --fp8_scaled (fp8_optimization_utils.quantize_weight), no marker.
//     "<m>.scale_weight" float32 is [] or [1] per tensor, [out, 1] per output channel, or
//     [out, in/bs, 1] per block of bs input elements of a row; block mode may add
//     "<m>.scale_weight_tensor", one float32 t (two-level scaling). w[o][i] = q[o][i]·s (per
//     tensor), q[o][i]·s[o] (per channel), q[o][i]·s[o][i/bs]·t (block-wise, t = 1 when absent).
//     Only the Linear weights of the blocks (transformer_blocks, single_transformer_blocks) are
//     quantized; per tensor where the input dim does not divide by the block size.
//
// A file with the marker or any scale_input is Comfy; one with scales and neither is Musubi (a
// per-tensor scale means the same in both). Anything else 8-bit (a scale without its fp8 weight, a
// scale of the wrong shape or dtype, scale_weight_tensor without block scales, ComfyUI's newer
// per-layer "comfy_quant" / "weight_scale" formats) is an error naming the tensor.
package fp8

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strings"

	"github.com/framepackd/framepackd/internal/safetensors"
)

// ErrLayout is wrapped by every error about an 8-bit layout Detect or Scales cannot read.
var ErrLayout = errors.New("unsupported or inconsistent fp8 layout")

// Format is an 8-bit checkpoint format.
type Format string

// The formats (see the package doc).
const (
	None   Format = ""       // no 8-bit tensors
	Plain  Format = "plain"  // fp8 casts, no scales
	Comfy  Format = "comfy"  // ComfyUI scaled fp8
	Musubi Format = "musubi" // musubi-tuner fp8_scaled
	// Quantized is the format of weights quantized at load (nn.Options.QuantizeLinear): per
	// output channel e4m3, s[o] = max(max|w[o]|/448, 1e-8), q = e4m3(clamp(w/s, ±448)).
	Quantized Format = "quantized"
)

// Marker is ComfyUI's scaled-fp8 marker tensor.
const Marker = "scaled_fp8"

// Name suffixes of the scale tensors.
const (
	suffixWeight      = ".weight"
	suffixScale       = ".scale_weight"
	suffixTensorScale = ".scale_weight_tensor"
	suffixInputScale  = ".scale_input"
)

// Source is what Detect reads: tensor names, dtypes and shapes, and (Scales) their bytes.
type Source interface {
	Names() []string
	Info(name string) (safetensors.TensorInfo, bool)
	Bytes(name string) ([]byte, error)
}

// Weight is one 8-bit weight of a checkpoint and how it dequantizes.
type Weight struct {
	Name  string            // the fp8 tensor ("transformer_blocks.0.attn.to_q.weight")
	DType safetensors.DType // F8E4M3 or F8E5M2
	Shape []int64
	// Scale names the scale tensor (empty: 1); TensorScale musubi's second level (empty: 1);
	// InputScale ComfyUI's activation scale (checked, unused).
	Scale, TensorScale, InputScale string
	// Rows and Blocks are the shape Scales returns: [1, 1] per tensor, [out, 1] per output
	// channel, [out, in/bs] per block of bs input elements.
	Rows, Blocks int
}

// Scaled reports whether the weight has a scale (false for nil: no 8-bit weight).
func (w *Weight) Scaled() bool { return w != nil && (w.Scale != "" || w.TensorScale != "") }

// BlockSize is the number of input elements one scale covers along a row (the row's length
// for per-tensor and per-channel scales).
func (w *Weight) BlockSize() int {
	in := 1
	if len(w.Shape) >= 2 {
		in = int(w.Shape[len(w.Shape)-1])
	}
	return in / max(w.Blocks, 1)
}

// Layout is what Detect found: the format and every 8-bit weight by name.
type Layout struct {
	Format  Format
	Weights map[string]*Weight
	// Aux lists the tensors the layout consumes besides the weights (the marker, the scales),
	// which a loader marks as used.
	Aux []string
}

// Weight returns the entry of an 8-bit weight (nil for a tensor that is not one, or a nil
// layout).
func (l *Layout) Weight(name string) *Weight {
	if l == nil {
		return nil
	}
	return l.Weights[name]
}

// Add records a weight (a loader's host copy describing what it holds).
func (l *Layout) Add(w *Weight) {
	if l.Weights == nil {
		l.Weights = map[string]*Weight{}
	}
	l.Weights[w.Name] = w
	for _, a := range []string{w.Scale, w.TensorScale, w.InputScale} {
		if a != "" {
			l.Aux = append(l.Aux, a)
		}
	}
}

// Detect reads src's names, dtypes and shapes and returns its 8-bit layout: nil when src has
// no 8-bit tensor and no scale, an error wrapping ErrLayout naming the tensor when the layout is
// unknown or inconsistent.
func Detect(src Source) (*Layout, error) {
	names := src.Names()
	byName := map[string]safetensors.TensorInfo{}
	for _, n := range names {
		info, _ := src.Info(n)
		byName[n] = info
	}
	bad := func(name, format string, args ...any) error {
		return fmt.Errorf("%w: tensor %s: %s", ErrLayout, name, fmt.Sprintf(format, args...))
	}
	_, marker := byName[Marker]
	var fp8s, scales, tensorScales, inputScales []string
	for _, n := range names {
		info := byName[n]
		switch {
		case n == Marker:
		case strings.HasSuffix(n, suffixScale):
			scales = append(scales, n)
		case strings.HasSuffix(n, suffixTensorScale):
			tensorScales = append(tensorScales, n)
		case strings.HasSuffix(n, suffixInputScale):
			inputScales = append(inputScales, n)
		case strings.HasSuffix(n, ".comfy_quant"), strings.HasSuffix(n, ".weight_scale"), strings.HasSuffix(n, ".weight_scale_2"),
			strings.HasSuffix(n, ".input_scale"):
			return nil, bad(n, "a quantization format this loader does not read (ComfyUI's per-layer comfy_quant / weight_scale "+
				"layouts); supported are plain fp8 casts, ComfyUI's scaled_fp8 (scale_weight, scale_input) and musubi-tuner's fp8_scaled")
		case info.DType.IsFP8():
			fp8s = append(fp8s, n)
		}
	}
	if !marker && len(fp8s) == 0 && len(scales)+len(tensorScales)+len(inputScales) == 0 {
		return nil, nil
	}
	l := &Layout{Weights: map[string]*Weight{}}
	switch {
	case marker || len(inputScales) > 0:
		l.Format = Comfy
	case len(scales) > 0:
		l.Format = Musubi
	default:
		l.Format = Plain
	}
	if marker {
		info := byName[Marker]
		if !info.DType.IsFP8() && info.DType != safetensors.F32 {
			return nil, bad(Marker, "marker dtype %s: ComfyUI's marker is empty, of the fp8 dtype (or F32)", info.DType)
		}
		if info.NumElements() > 2 {
			return nil, bad(Marker, "marker of %d elements: ComfyUI's has 0 (or 2)", info.NumElements())
		}
		l.Aux = append(l.Aux, Marker)
	}
	for _, n := range fp8s {
		info := byName[n]
		l.Weights[n] = &Weight{Name: n, DType: info.DType, Shape: info.Shape, Rows: 1, Blocks: 1}
	}
	// owner returns the fp8 weight a scale named n (with suffix) belongs to.
	owner := func(n, suffix string) (*Weight, error) {
		wn := strings.TrimSuffix(n, suffix) + suffixWeight
		w := l.Weights[wn]
		if w == nil {
			if info, ok := byName[wn]; ok {
				return nil, bad(n, "a scale for %s, which is %s, not an 8-bit float", wn, info.DType)
			}
			return nil, bad(n, "a scale without its weight %s", wn)
		}
		return w, nil
	}
	scalar := func(n string) error {
		info := byName[n]
		if info.DType != safetensors.F32 && info.DType != safetensors.F16 && info.DType != safetensors.BF16 {
			return bad(n, "dtype %s, want float32", info.DType)
		}
		if info.NumElements() != 1 || len(info.Shape) > 1 {
			return bad(n, "shape %v, want one value (0-d or [1])", info.Shape)
		}
		return nil
	}
	for _, n := range scales {
		w, err := owner(n, suffixScale)
		if err != nil {
			return nil, err
		}
		info := byName[n]
		if info.DType != safetensors.F32 && info.DType != safetensors.F16 && info.DType != safetensors.BF16 {
			return nil, bad(n, "dtype %s, want float32", info.DType)
		}
		w.Scale = n
		l.Aux = append(l.Aux, n)
		s := info.Shape
		switch {
		case info.NumElements() == 1 && len(s) <= 1:
			// per tensor: [1, 1]
		case l.Format == Musubi && len(w.Shape) == 2 && len(s) == 2 && s[0] == w.Shape[0] && s[1] == 1:
			w.Rows = int(s[0])
		case l.Format == Musubi && len(w.Shape) == 2 && len(s) == 3 && s[0] == w.Shape[0] && s[2] == 1 && s[1] > 0 && w.Shape[1]%s[1] == 0:
			w.Rows, w.Blocks = int(s[0]), int(s[1])
		case l.Format == Comfy:
			return nil, bad(n, "shape %v: ComfyUI's scale_weight is one float32 (0-d)", s)
		default:
			return nil, bad(n, "shape %v for weight %s %v: want [] or [1] (per tensor), [%d, 1] (per output channel) or "+
				"[%d, in/block, 1] (block-wise, the block dividing %d)", s, w.Name, w.Shape, w.out(), w.out(), w.in())
		}
	}
	for _, n := range tensorScales {
		w, err := owner(n, suffixTensorScale)
		if err != nil {
			return nil, err
		}
		if err := scalar(n); err != nil {
			return nil, err
		}
		if w.Blocks <= 1 && (w.Scale == "" || len(byName[w.Scale].Shape) != 3) {
			return nil, bad(n, "a tensor scale without block-wise scale_weight for %s (musubi writes it only in block mode)", w.Name)
		}
		w.TensorScale = n
		l.Aux = append(l.Aux, n)
	}
	for _, n := range inputScales {
		w, err := owner(n, suffixInputScale)
		if err != nil {
			return nil, err
		}
		if err := scalar(n); err != nil {
			return nil, err
		}
		w.InputScale = n
		l.Aux = append(l.Aux, n)
	}
	sort.Strings(l.Aux)
	return l, nil
}

func (w *Weight) out() int64 {
	if len(w.Shape) == 0 {
		return 1
	}
	return w.Shape[0]
}

func (w *Weight) in() int64 {
	if len(w.Shape) < 2 {
		return 1
	}
	return w.Shape[len(w.Shape)-1]
}

// Scales returns the weight's scales as [Rows, Blocks] float32 values, musubi's tensor scale
// multiplied in (one float32 rounding), all ones for an unscaled weight. A scale that is not
// finite is an error naming it.
func (w *Weight) Scales(src Source) ([]float32, error) {
	n := w.Rows * w.Blocks
	out := make([]float32, n)
	for i := range out {
		out[i] = 1
	}
	if w.Scale != "" {
		v, err := floats(src, w.Scale, n)
		if err != nil {
			return nil, err
		}
		copy(out, v)
	}
	if w.TensorScale != "" {
		t, err := floats(src, w.TensorScale, 1)
		if err != nil {
			return nil, err
		}
		for i := range out {
			out[i] *= t[0]
		}
	}
	for i, v := range out {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%w: tensor %s: scale %d is %g", ErrLayout, w.Scale, i, v)
		}
	}
	return out, nil
}

// Dequantize returns the weight's values q·s as float32 (one rounding of the product), for the
// tensors a model cannot compute with in 8 bits (a convolution's weight stored in fp8) and for
// merging LoRAs.
func (w *Weight) Dequantize(src Source) ([]float32, error) {
	s, err := w.Scales(src)
	if err != nil {
		return nil, err
	}
	raw, err := src.Bytes(w.Name)
	if err != nil {
		return nil, err
	}
	decode := safetensors.E4M3ToF32
	if w.DType == safetensors.F8E5M2 {
		decode = safetensors.E5M2ToF32
	}
	var table [256]float32
	for q := range table {
		table[q] = decode(uint8(q))
	}
	out := make([]float32, len(raw))
	in := int(w.in())
	if in == 0 {
		return out, nil
	}
	bs := in / w.Blocks
	for i, q := range raw {
		row, col := i/in, i%in
		r := 0
		if w.Rows > 1 {
			r = row
		}
		out[i] = table[q] * s[r*w.Blocks+col/bs]
	}
	return out, nil
}

// floats reads tensor name as float32 values, checking it has n.
func floats(src Source, name string, n int) ([]float32, error) {
	info, ok := src.Info(name)
	if !ok {
		return nil, fmt.Errorf("%w: tensor %s: missing", ErrLayout, name)
	}
	raw, err := src.Bytes(name)
	if err != nil {
		return nil, err
	}
	if int(info.NumElements()) != n {
		return nil, fmt.Errorf("%w: tensor %s: %d values, want %d", ErrLayout, name, info.NumElements(), n)
	}
	v := make([]float32, n)
	for i := range v {
		switch info.DType {
		case safetensors.F32:
			v[i] = math.Float32frombits(uint32(raw[4*i]) | uint32(raw[4*i+1])<<8 | uint32(raw[4*i+2])<<16 | uint32(raw[4*i+3])<<24)
		case safetensors.F16:
			v[i] = safetensors.F16ToF32(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8)
		case safetensors.BF16:
			v[i] = safetensors.BF16ToF32(uint16(raw[2*i]) | uint16(raw[2*i+1])<<8)
		default:
			return nil, fmt.Errorf("%w: tensor %s: dtype %s, want float32", ErrLayout, name, info.DType)
		}
	}
	return v, nil
}
