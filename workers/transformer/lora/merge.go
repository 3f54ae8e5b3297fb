package lora

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sort"
	"strings"
	"sync"

	"github.com/framepackd/framepackd/internal/fp8"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// Source is a checkpoint's named tensors (*safetensors.Checkpoint, *safetensors.File, or
// another Merged).
type Source interface {
	Info(name string) (safetensors.TensorInfo, bool)
	Bytes(name string) ([]byte, error)
	Names() []string
}

// Options adjust Merge.
type Options struct {
	// KeepDType stores a merged weight in the checkpoint's dtype of that weight (the model keeps
	// its weights as stored); otherwise merged weights are F32 and the loader converts them to
	// the dtype it keeps weights in, as it converts the checkpoint's.
	KeepDType bool
	// MatMul, when set, computes up @ down ([rows, rank] @ [rank, in] → [rows, in]) for the
	// merge, e.g. with the worker's runtime (OpenBLAS or the GPU); nil merges in Go, row by
	// row in float64 (slow for full-size models).
	MatMul func(up []float32, rows, rank int, down []float32, in int) ([]float32, error)
}

// Applied reports one LoRA merged into a model.
type Applied struct {
	Path           string
	Strength       float64
	Format         Format
	WeightsChanged int // distinct model weights the file changed
}

// patch is one low-rank update of rows [row0, row0+rows) of a target weight [out, in…]:
// W[row0+o, :] += coef · Σ_k up[o, k] · down[k, :].
type patch struct {
	key   string
	row0  int
	rows  int
	rank  int
	in    int
	up    []float32 // [rows, rank]
	down  []float32 // [rank, in]
	coeff float64   // strength · alpha/rank
}

// Merged is base with LoRAs merged into its weights: the same names and shapes, the weights a
// LoRA changes recomputed when read.
//
// A weight stored in 8 bits (internal/fp8: plain, ComfyUI or musubi-tuner) is dequantized exactly
// by its format's rule, merged in float64 per row like any other, and handed on as F32 with its
// scale tensors hidden; Requantize says so, and the loader quantizes it back to 8 bits with the
// quantize-at-load rule (e4m3, one scale per output channel), so the model keeps every Linear it
// had in 8 bits in 8 bits.
type Merged struct {
	base    Source
	opts    Options
	patches map[string][]patch // target tensor name → updates in merge order
	quant   *fp8.Layout        // base's 8-bit weights (nil: none)
	hidden  map[string]bool    // scale tensors of merged 8-bit weights
}

var _ Source = (*Merged)(nil)

// Merge opens every spec's file and matches its keys to base's weights; several LoRAs stack in
// order. A key that matches no weight, a shape or rank that does not fit, or a file that changes
// nothing is an error naming the file and the key.
func Merge(base Source, specs []Spec, opts Options) (*Merged, []Applied, error) {
	m := &Merged{base: base, opts: opts, patches: map[string][]patch{}, hidden: map[string]bool{}}
	var err error
	if m.quant, err = fp8.Detect(base); err != nil {
		return nil, nil, err
	}
	idx := newIndex(base)
	var applied []Applied
	for _, s := range specs {
		if math.IsNaN(s.Strength) || math.IsInf(s.Strength, 0) {
			return nil, nil, fmt.Errorf("%w: lora %s: strength %v", ErrInvalid, s.Path, s.Strength)
		}
		f, err := Open(s.Path)
		if err != nil {
			return nil, nil, err
		}
		changed := map[string]bool{}
		for _, p := range f.pairs {
			ps, err := idx.resolve(p, s.Strength)
			if err != nil {
				return nil, nil, fmt.Errorf("lora %s: %w", s.Path, err)
			}
			for _, pt := range ps {
				m.patches[pt.target] = append(m.patches[pt.target], pt.patch)
				changed[pt.target] = true
			}
		}
		if len(changed) == 0 {
			return nil, nil, fmt.Errorf("%w: lora %s: changes no weight of the model", ErrInvalid, s.Path)
		}
		applied = append(applied, Applied{Path: s.Path, Strength: s.Strength, Format: f.Format, WeightsChanged: len(changed)})
	}
	for name := range m.patches {
		if w := m.quant.Weight(name); w != nil {
			for _, a := range []string{w.Scale, w.TensorScale, w.InputScale} {
				if a != "" {
					m.hidden[a] = true
				}
			}
		}
	}
	return m, applied, nil
}

// Requantize reports whether name is an 8-bit weight of base that a LoRA changed: Bytes hands it
// on in f32, for the loader to quantize again.
func (m *Merged) Requantize(name string) bool {
	return len(m.patches[name]) > 0 && m.quant.Weight(name) != nil
}

// Changed lists the names of the weights the LoRAs change, sorted.
func (m *Merged) Changed() []string {
	out := make([]string, 0, len(m.patches))
	for n := range m.patches {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Names lists base's tensors but the scales of merged 8-bit weights.
func (m *Merged) Names() []string {
	names := m.base.Names()
	if len(m.hidden) == 0 {
		return names
	}
	out := names[:0:0]
	for _, n := range names {
		if !m.hidden[n] {
			out = append(out, n)
		}
	}
	return out
}

// Info describes a tensor as Bytes returns it: a merged weight is F32 unless Options.KeepDType
// (and always when it was stored in 8 bits); the scales of a merged 8-bit weight are gone.
func (m *Merged) Info(name string) (safetensors.TensorInfo, bool) {
	if m.hidden[name] {
		return safetensors.TensorInfo{}, false
	}
	info, ok := m.base.Info(name)
	if !ok || len(m.patches[name]) == 0 {
		return info, ok
	}
	if !m.opts.KeepDType || info.DType.IsFP8() {
		info.DType = safetensors.F32
	}
	info.End = info.Begin + info.NumElements()*int64(info.DType.Size())
	return info, true
}

// Bytes returns a tensor's data; a weight a LoRA changes is merged now (in float64 per row,
// rounded once), in parallel over rows.
func (m *Merged) Bytes(name string) ([]byte, error) {
	ps := m.patches[name]
	if len(ps) == 0 {
		return m.base.Bytes(name)
	}
	info, _ := m.base.Info(name)
	var w []float32
	var err error
	if qw := m.quant.Weight(name); qw != nil {
		w, err = qw.Dequantize(m.base) // q·s by the format's rule
		info.DType = safetensors.F32
	} else {
		var raw []byte
		if raw, err = m.base.Bytes(name); err == nil {
			w, err = decode(raw, info.DType)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("merge %s: %w", name, err)
	}
	out := int(info.Shape[0])
	in := len(w) / out
	if m.opts.MatMul != nil {
		for _, p := range ps {
			delta, err := m.opts.MatMul(p.up, p.rows, p.rank, p.down, p.in)
			if err != nil {
				return nil, fmt.Errorf("merge %s (%s): %w", name, p.key, err)
			}
			if len(delta) != p.rows*in {
				return nil, fmt.Errorf("merge %s (%s): matmul gave %d values, want %d", name, p.key, len(delta), p.rows*in)
			}
			dst := w[p.row0*in : (p.row0+p.rows)*in]
			for i, d := range delta {
				dst[i] = float32(float64(dst[i]) + p.coeff*float64(d))
			}
		}
		return m.encode(w, info.DType)
	}
	byRow := make([][]*patch, out)
	for i := range ps {
		p := &ps[i]
		for o := p.row0; o < p.row0+p.rows; o++ {
			byRow[o] = append(byRow[o], p)
		}
	}
	workers := min(runtime.GOMAXPROCS(0), out)
	var wg sync.WaitGroup
	for g := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			acc := make([]float64, in)
			for o := g; o < out; o += workers {
				if len(byRow[o]) == 0 {
					continue
				}
				row := w[o*in : (o+1)*in]
				for j, v := range row {
					acc[j] = float64(v)
				}
				for _, p := range byRow[o] {
					up := p.up[(o-p.row0)*p.rank : (o-p.row0+1)*p.rank]
					for k, u := range up {
						c := p.coeff * float64(u)
						d := p.down[k*in : (k+1)*in]
						for j, dv := range d {
							acc[j] += c * float64(dv)
						}
					}
				}
				for j := range row {
					row[j] = float32(acc[j])
				}
			}
		}()
	}
	wg.Wait()
	return m.encode(w, info.DType)
}

// encode writes a merged weight as Info says: F32, or stored the checkpoint's dtype.
func (m *Merged) encode(w []float32, stored safetensors.DType) ([]byte, error) {
	if m.opts.KeepDType {
		return encode(w, stored)
	}
	return encode(w, safetensors.F32)
}

// target is a patch with the weight it updates.
type target struct {
	target string
	patch
}

// index finds a model's weights by the names LoRA files use.
type index struct {
	src        Source
	underscore map[string]string // module with _ for . → module (kohya names)
}

func newIndex(src Source) *index {
	ix := &index{src: src, underscore: map[string]string{}}
	for _, n := range src.Names() {
		if mod, ok := strings.CutSuffix(n, ".weight"); ok {
			ix.underscore[underscore(mod)] = mod
		}
	}
	return ix
}

// resolve maps one pair of a file onto the model's weights: one patch, or one per split of a
// fused weight.
func (ix *index) resolve(p *pair, strength float64) ([]target, error) {
	var modules []string
	swap := false
	switch p.format {
	case FormatMusubi:
		if mod, ok := ix.underscore[p.module]; ok {
			modules = []string{mod}
		} else if t, s, ok := mapOriginal(p.module); ok {
			modules, swap = t, s
		}
	case FormatOriginal:
		if t, s, ok := mapOriginal(p.module); ok {
			modules, swap = t, s
		}
	default:
		if _, ok := ix.src.Info(p.module + ".weight"); ok {
			modules = []string{p.module}
		}
	}
	if len(modules) == 0 {
		return nil, fmt.Errorf("%w: key %s matches no weight of the model", ErrInvalid, p.key)
	}
	rank := p.rank()
	in := 1
	for _, d := range p.downShape[1:] {
		in *= int(d)
	}
	upRows := int(p.upShape[0])
	coeff := strength * p.scale()
	var out []target
	row := 0
	for _, mod := range modules {
		name := mod + ".weight"
		info, ok := ix.src.Info(name)
		if !ok {
			return nil, fmt.Errorf("%w: key %s: the model has no weight %s", ErrInvalid, p.key, name)
		}
		if len(info.Shape) < 2 || !info.DType.IsFloat() {
			return nil, fmt.Errorf("%w: key %s: weight %s %s%v is not a matrix", ErrInvalid, p.key, name, info.DType, info.Shape)
		}
		rows := int(info.Shape[0])
		win := int(info.NumElements()) / rows
		if win != in {
			return nil, fmt.Errorf("%w: key %s: shape mismatch: down %v has %d inputs, weight %s %v has %d",
				ErrInvalid, p.downKey, p.downShape, in, name, info.Shape, win)
		}
		if row+rows > upRows {
			return nil, fmt.Errorf("%w: key %s: shape mismatch: up %v has %d rows, %s needs %d",
				ErrInvalid, p.upKey, p.upShape, upRows, strings.Join(modules, " + "), row+rows)
		}
		out = append(out, target{target: name, patch: patch{
			key: p.key, row0: 0, rows: rows, rank: rank, in: in,
			up:    p.up[row*rank : (row+rows)*rank],
			down:  p.down,
			coeff: coeff,
		}})
		row += rows
	}
	if swap && (len(out) != 1 || upRows%2 != 0) {
		return nil, fmt.Errorf("%w: key %s: up %v cannot be split into shift and scale", ErrInvalid, p.upKey, p.upShape)
	}
	if swap {
		// The up's halves are shift, scale; the weight's are scale, shift: two patches, the
		// up's scale half onto the weight's first half and its shift half onto the second.
		h := upRows / 2
		t := out[0]
		first, second := t, t
		first.rows, first.up = h, p.up[h*rank:upRows*rank]
		second.row0, second.rows, second.up = h, h, p.up[:h*rank]
		return []target{first, second}, nil
	}
	if row != upRows {
		return nil, fmt.Errorf("%w: key %s: shape mismatch: up %v has %d rows, %s has %d",
			ErrInvalid, p.upKey, p.upShape, upRows, strings.Join(modules, " + "), row)
	}
	return out, nil
}

func decode(raw []byte, dt safetensors.DType) ([]float32, error) {
	n := len(raw) / max(dt.Size(), 1)
	out := make([]float32, n)
	switch dt {
	case safetensors.F32:
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	case safetensors.F64:
		for i := range out {
			out[i] = float32(math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:])))
		}
	case safetensors.F16:
		for i := range out {
			out[i] = safetensors.F16ToF32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	case safetensors.BF16:
		for i := range out {
			out[i] = safetensors.BF16ToF32(binary.LittleEndian.Uint16(raw[2*i:]))
		}
	default:
		return nil, fmt.Errorf("dtype %s is not a float type", dt)
	}
	return out, nil
}

func encode(v []float32, dt safetensors.DType) ([]byte, error) {
	out := make([]byte, len(v)*dt.Size())
	switch dt {
	case safetensors.F32:
		for i, x := range v {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		}
	case safetensors.F64:
		for i, x := range v {
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(float64(x)))
		}
	case safetensors.F16:
		for i, x := range v {
			binary.LittleEndian.PutUint16(out[2*i:], safetensors.F32ToF16(x))
		}
	case safetensors.BF16:
		for i, x := range v {
			binary.LittleEndian.PutUint16(out[2*i:], safetensors.F32ToBF16(x))
		}
	default:
		return nil, fmt.Errorf("dtype %s is not a float type", dt)
	}
	return out, nil
}
