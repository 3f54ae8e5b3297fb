package torchrng

import (
	"errors"
	"fmt"
	"math"
)

// ErrBadShape is returned (wrapped) for a negative dimension or an element count that overflows.
var ErrBadShape = errors.New("bad shape")

// maxElements bounds one tensor (2^40 float32 values is far beyond any latent).
const maxElements = 1 << 40

// NumElements returns the number of elements of shape, checking every dimension.
func NumElements(shape []int) (int, error) {
	n := 1
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("%w: %v has a negative dimension", ErrBadShape, shape)
		}
		if d != 0 && n > maxElements/d {
			return 0, fmt.Errorf("%w: %v has too many elements", ErrBadShape, shape)
		}
		n *= d
	}
	return n, nil
}

// Randn returns torch.randn(shape, generator=g) for a float32 CPU tensor, flattened in
// row-major order, and advances g exactly as PyTorch advances its generator.
func (g *Generator) Randn(shape []int) ([]float32, error) {
	n, err := NumElements(shape)
	if err != nil {
		return nil, fmt.Errorf("randn: %w", err)
	}
	out := make([]float32, n)
	g.FillRandn(out)
	return out, nil
}

// FillRandn fills dst as torch.randn of a contiguous float32 tensor of len(dst) elements does.
func (g *Generator) FillRandn(dst []float32) {
	n := len(dst)
	if n < 16 {
		// Scalar path: at::normal_distribution<double>(0, 1) per element, cast to float.
		for i := range dst {
			dst[i] = float32(g.normalFloat64())
		}
		return
	}
	for i := range dst {
		dst[i] = g.uniformFloat32()
	}
	for i := 0; i+16 <= n; i += 16 {
		normalFill16(dst[i : i+16])
	}
	if n%16 != 0 {
		// Recompute the last 16 values from fresh uniforms.
		tail := dst[n-16:]
		for i := range tail {
			tail[i] = g.uniformFloat32()
		}
		normalFill16(tail)
	}
}

// normalFill16 is normal_fill_16_AVX2 with mean 0 and std 1: Box-Muller pairing element j
// (radius from 1-u) with element j+8 (angle), float32 throughout.
func normalFill16(d []float32) {
	_ = d[15]
	for j := 0; j < 8; j++ {
		u1 := 1 - d[j]
		u2 := d[j+8]
		radius := float32(math.Sqrt(float64(float32(-2) * avxLog(u1))))
		theta := twoPi * u2
		s, c := avxSincos(theta)
		// _mm256_fmadd_ps(n, std=1, mean=0): exact, except that -0 becomes +0.
		d[j] = float32(radius*c) + 0
		d[j+8] = float32(radius*s) + 0
	}
}

// twoPi is _mm256_set1_ps(2.0f * c10::pi<double>): 2π as a double, then rounded to float.
var twoPi = toF32(2 * math.Pi)
