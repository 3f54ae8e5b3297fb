package causalvae

import (
	"fmt"
)

// Volume is a host float32 array [B, C, T, H, W], row-major (W fastest): pixels, latents and
// moments as they enter and leave the model. Tiles are cut from and blended into Volumes on the
// host, so the runtime only ever holds one tile's activations.
type Volume struct {
	Shape [5]int
	Data  []float32
}

// NewVolume allocates a zeroed volume.
func NewVolume(shape [5]int) Volume {
	return Volume{Shape: shape, Data: make([]float32, numel5(shape))}
}

// WrapVolume checks that data holds exactly shape's elements and returns it as a volume
// (sharing data).
func WrapVolume(shape [5]int, data []float32) (Volume, error) {
	for i, d := range shape {
		if d < 0 {
			return Volume{}, fmt.Errorf("volume: negative dim %d in %v", i, shape)
		}
	}
	if len(data) != numel5(shape) {
		return Volume{}, fmt.Errorf("volume: %d values for shape %v (%d)", len(data), shape, numel5(shape))
	}
	return Volume{Shape: shape, Data: data}, nil
}

func numel5(s [5]int) int { return s[0] * s[1] * s[2] * s[3] * s[4] }

// Len returns the number of elements.
func (v Volume) Len() int { return numel5(v.Shape) }

// ShapeInt returns the shape as a slice (for the runtime).
func (v Volume) ShapeInt() []int { return v.Shape[:] }

// ShapeInt64 returns the shape as int64s (for safetensors).
func (v Volume) ShapeInt64() []int64 {
	s := make([]int64, 5)
	for i, d := range v.Shape {
		s[i] = int64(d)
	}
	return s
}

func (v Volume) strides() [5]int {
	var st [5]int
	st[4] = 1
	for i := 3; i >= 0; i-- {
		st[i] = st[i+1] * v.Shape[i+1]
	}
	return st
}

// copyRegion copies the box of size at srcOff in src to dstOff in dst.
func copyRegion(dst Volume, dstOff [5]int, src Volume, srcOff [5]int, size [5]int) {
	for i := range 5 {
		if size[i] <= 0 {
			return
		}
	}
	ds, ss := dst.strides(), src.strides()
	n := size[4]
	for b := range size[0] {
		for c := range size[1] {
			for t := range size[2] {
				for h := range size[3] {
					di := (dstOff[0]+b)*ds[0] + (dstOff[1]+c)*ds[1] + (dstOff[2]+t)*ds[2] + (dstOff[3]+h)*ds[3] + dstOff[4]
					si := (srcOff[0]+b)*ss[0] + (srcOff[1]+c)*ss[1] + (srcOff[2]+t)*ss[2] + (srcOff[3]+h)*ss[3] + srcOff[4]
					copy(dst.Data[di:di+n], src.Data[si:si+n])
				}
			}
		}
	}
}

// sub returns a copy of v[..., t0:t1, h0:h1, w0:w1] (bounds clamped as Python slicing does).
func (v Volume) sub(t0, t1, h0, h1, w0, w1 int) Volume {
	clamp := func(a, b, n int) (int, int) {
		a, b = min(a, n), min(b, n)
		return a, max(a, b)
	}
	t0, t1 = clamp(t0, t1, v.Shape[2])
	h0, h1 = clamp(h0, h1, v.Shape[3])
	w0, w1 = clamp(w0, w1, v.Shape[4])
	out := NewVolume([5]int{v.Shape[0], v.Shape[1], t1 - t0, h1 - h0, w1 - w0})
	copyRegion(out, [5]int{}, v, [5]int{0, 0, t0, h0, w0}, out.Shape)
	return out
}

// dropFirstFrames returns v[:, :, k:] (a copy).
func (v Volume) dropFirstFrames(k int) Volume {
	return v.sub(k, v.Shape[2], 0, v.Shape[3], 0, v.Shape[4])
}

// blend mixes the last extent slices of a along axis (2 = T, 3 = H, 4 = W) into the first
// ones of b, in place: b[k] = a[n−e+k]·(1 − k/e) + b[k]·(k/e) with e = min(a_n, b_n, extent),
// as diffusers' blend_t / blend_v / blend_h do. The other dims of a and b must match.
func blend(a, b Volume, axis, extent int) error {
	for i := range 5 {
		if i != axis && a.Shape[i] != b.Shape[i] {
			return fmt.Errorf("blend along dim %d: shapes %v and %v differ", axis, a.Shape, b.Shape)
		}
	}
	e := min(a.Shape[axis], b.Shape[axis], extent)
	if e <= 0 {
		return nil
	}
	as := a.strides()
	// outer: dims before axis; inner: contiguous block after it.
	outer := 1
	for i := range axis {
		outer *= a.Shape[i]
	}
	inner := as[axis]
	na, nb := a.Shape[axis], b.Shape[axis]
	for k := range e {
		r := float64(k) / float64(e)
		wa, wb := float32(1-r), float32(r)
		for o := range outer {
			ai := o*na*inner + (na-e+k)*inner
			bi := o*nb*inner + k*inner
			av := a.Data[ai : ai+inner]
			bv := b.Data[bi : bi+inner]
			for j := range bv {
				bv[j] = av[j]*wa + bv[j]*wb
			}
		}
	}
	return nil
}
