package nn

import (
	"fmt"
	"math"
	"strings"

	"github.com/framepackd/framepackd/internal/fp8"
	"github.com/framepackd/framepackd/internal/runtime"
	"github.com/framepackd/framepackd/internal/safetensors"
)

// detectFP8 reads src's 8-bit layout (a HostSource knows its own), adding a layout error to errs.
func detectFP8(src Source, errs []error) (*fp8.Layout, []error) {
	if h, ok := src.(*HostSource); ok {
		return h.quant, errs
	}
	l, err := fp8.Detect(src)
	if err != nil {
		return nil, append(errs, fmt.Errorf("%w: %w", ErrCheckpoint, err))
	}
	return l, errs
}

// FP8Format is the 8-bit format of the loader's source (fp8.None when it has no 8-bit
// weights; fp8.Quantized when it quantizes at load and the source has none; a source whose
// every 8-bit weight a LoRA changed reports none here, its weights quantized again).
func (l *Loader) FP8Format() fp8.Format {
	if l.quant != nil {
		return l.quant.Format
	}
	if l.quantize || l.requantized {
		return fp8.Quantized
	}
	return fp8.None
}

// LinearWeight binds a Linear's weight name [out, in]. A weight stored in 8 bits is kept as
// stored, with its scales as an F32 [rows, blocks] tensor (fpk_op_gemm_q's w_scale; nil when it
// has none); with Options.QuantizeLinear a 16- or 32-bit weight is quantized to e4m3 per output
// channel (runtime.QuantizeRows); any other weight binds as Weight does, with no scale.
func (l *Loader) LinearWeight(name string, out, in int) (w, scale *runtime.Tensor) {
	full := l.prefix + name
	shape := []int{out, in}
	switch {
	case l.shapes != nil:
		l.linear[full] = true
		if l.quantize {
			l.used[full] = true
			l.shapes[full] = shape
			l.sdtype[full] = runtime.F8E4M3
			return nil, nil
		}
		return l.Weight(name, out, in), nil
	case l.rng != nil:
		if !l.quantize {
			return l.Weight(name, out, in), nil
		}
		l.used[full] = true
		if len(l.errs) > 0 {
			return nil, nil
		}
		t, err := l.rt.FromFloat32(l.randomValues(full, shape), shape...)
		if err != nil {
			l.keep(full, nil, err)
			return nil, nil
		}
		defer t.Free()
		return l.quantizeBind(full, t, shape)
	}
	qw := l.quant.Weight(full)
	if qw == nil && !l.quantize && !requantize(l.src, full) {
		return l.Weight(name, out, in), nil
	}
	if qw == nil { // quantize at load: a 16- or 32-bit weight (or an 8-bit one a LoRA changed)
		l.requantized = l.requantized || !l.quantize
		info, ok := l.check(full, shape)
		if !ok || len(l.errs) > 0 {
			return nil, nil
		}
		// A 16- or 32-bit weight as stored (bf16 as bf16, staged where the loader stages):
		// QuantizeRows widens it to f32 on the device, exactly, so the result is the one of
		// an f32 upload at half the bytes moved and no host conversion. Anything else (an
		// 8-bit weight a LoRA source re-encoded) is widened to f32 by LoadTensor first.
		dt := runtime.F32
		switch info.DType {
		case safetensors.BF16, safetensors.F16, safetensors.F32:
			dt = runtime.AsStored
		}
		t, err := l.upload(full, info, dt, shape)
		if err != nil {
			l.problem(full, "unreadable: %v", err)
			return nil, nil
		}
		defer t.Free()
		return l.quantizeBind(full, t, shape)
	}
	if len(qw.Shape) != 2 {
		l.problem(full, "an 8-bit weight of shape %v bound as a Linear [%d, %d]", qw.Shape, out, in)
		return nil, nil
	}
	w = l.bindAs(runtime.AsStored, name, shape, true)
	if w == nil && l.host == nil {
		return nil, nil
	}
	if !qw.Scaled() || len(l.errs) > 0 {
		if l.host != nil && len(l.errs) == 0 {
			l.host.quant.Add(&fp8.Weight{Name: l.hostName(full), DType: qw.DType, Shape: qw.Shape, Rows: 1, Blocks: 1})
		}
		return w, nil
	}
	s, err := qw.Scales(l.src)
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("%w: %w", ErrCheckpoint, err))
		return w, nil
	}
	return w, l.bindScale(full, qw.DType, qw.Shape, s, qw.Rows, qw.Blocks)
}

// requantize reports whether src hands on name, stored in 8 bits, in 16 or 32 bits for the loader
// to quantize again (a LoRA merged into it: lora.Merged).
func requantize(src Source, name string) bool {
	r, ok := src.(interface{ Requantize(string) bool })
	return ok && r.Requantize(name)
}

// quantizeBind quantizes the f32 weight t per output channel and binds q and its scales under
// full (uploaded, or recorded in the host copy).
func (l *Loader) quantizeBind(full string, t *runtime.Tensor, shape []int) (w, scale *runtime.Tensor) {
	q, s, err := l.rt.QuantizeRows(t)
	if err != nil {
		l.keep(full, nil, fmt.Errorf("quantize: %w", err))
		return nil, nil
	}
	if l.host != nil {
		defer q.Free()
		defer s.Free()
		raw, err := q.Bytes()
		if err == nil {
			err = l.host.record(l.hostName(full), runtime.F8E4M3, shape, raw)
		}
		var sv []float32
		if err == nil {
			sv, err = s.Float32()
		}
		if err != nil {
			l.errs = append(l.errs, fmt.Errorf("tensor %s: host copy: %w", full, err))
			return nil, nil
		}
		l.hostBytes += int64(len(raw))
		return nil, l.bindScale(full, safetensors.F8E4M3, []int64{int64(shape[0]), int64(shape[1])}, sv, shape[0], 1)
	}
	return l.keep(full, q, nil), l.keep(scaleName(full), s, nil)
}

// scaleName is the name a weight's scales are kept under in host copies.
func scaleName(weight string) string { return strings.TrimSuffix(weight, ".weight") + ".scale_weight" }

// hostName is full as the host copy names it (BeginHost's strip removed).
func (l *Loader) hostName(full string) string { return strings.TrimPrefix(full, l.hostStrip) }

// bindScale uploads (or records in the host copy) the scales s [rows, blocks] of the 8-bit
// weight full of dtype dt and shape.
func (l *Loader) bindScale(full string, dt safetensors.DType, shape []int64, s []float32, rows, blocks int) *runtime.Tensor {
	sn := scaleName(full)
	if l.host != nil {
		raw := make([]byte, 4*len(s))
		for i, v := range s {
			putF32(raw[4*i:], v)
		}
		if err := l.host.record(l.hostName(sn), runtime.F32, []int{rows, blocks}, raw); err != nil {
			l.errs = append(l.errs, fmt.Errorf("tensor %s: host copy: %w", sn, err))
			return nil
		}
		l.hostBytes += int64(len(raw))
		l.host.quant.Add(&fp8.Weight{Name: l.hostName(full), DType: dt, Shape: shape, Scale: l.hostName(sn), Rows: rows, Blocks: blocks})
		return nil
	}
	t, err := l.rt.FromFloat32(s, rows, blocks)
	return l.keep(sn, t, err)
}

// bindDequantized binds a scaled 8-bit tensor a model cannot use in 8 bits (a convolution's
// weight) as dt, dequantized on the host: q·s in f32, rounded once to dt.
func (l *Loader) bindDequantized(full string, qw *fp8.Weight, dt runtime.DType, shape []int) *runtime.Tensor {
	v, err := qw.Dequantize(l.src)
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("%w: %w", ErrCheckpoint, err))
		return nil
	}
	t, err := l.rt.FromFloat32As(dt, v, shape...)
	if err != nil || l.host == nil {
		return l.keep(full, t, err)
	}
	defer t.Free()
	raw, err := t.Bytes()
	if err == nil {
		err = l.host.record(l.hostName(full), dt, shape, raw)
	}
	if err != nil {
		l.errs = append(l.errs, fmt.Errorf("tensor %s: host copy: %w", full, err))
		return nil
	}
	l.hostBytes += int64(len(raw))
	return nil
}

func putF32(b []byte, v float32) {
	u := math.Float32bits(v)
	b[0], b[1], b[2], b[3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
}
