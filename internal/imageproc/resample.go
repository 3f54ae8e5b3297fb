package imageproc

import (
	"fmt"
	"math"
)

// Filter is a resampling kernel as Pillow defines it: a function of distance in source pixels and
// the support (half width) at scale 1.
type Filter struct {
	Name    string
	Support float64
	Kernel  func(x float64) float64
}

// Lanczos is Pillow's Image.LANCZOS: a windowed sinc with a = 3 (support 3).
var Lanczos = Filter{Name: "lanczos", Support: 3, Kernel: lanczosKernel}

// Bicubic is Pillow's Image.BICUBIC: the cubic convolution kernel with a = -0.5 (support 2).
var Bicubic = Filter{Name: "bicubic", Support: 2, Kernel: bicubicKernel}

func sinc(x float64) float64 {
	if x == 0 {
		return 1
	}
	x *= math.Pi
	return math.Sin(x) / x
}

func lanczosKernel(x float64) float64 {
	if x >= -3 && x < 3 {
		return sinc(x) * sinc(x/3)
	}
	return 0
}

func bicubicKernel(x float64) float64 {
	const a = -0.5
	if x < 0 {
		x = -x
	}
	if x < 1 {
		return ((a+2)*x-(a+3))*x*x + 1
	}
	if x < 2 {
		return (((x-5)*x+8)*x - 4) * a
	}
	return 0
}

// precisionBits is the fixed-point precision of Pillow's 8-bit resampler: 32 bits less 8 for the
// pixel value and 2 for the overshoot of kernels with negative lobes.
const precisionBits = 32 - 8 - 2

// axisCoeffs are the weights of one resampling axis: output position i reads input positions
// start[i] … start[i]+count[i]-1 with weights w[i*ksize : i*ksize+count[i]].
type axisCoeffs struct {
	ksize        int
	start, count []int
	w            []int32
}

// computeCoeffs derives the fixed-point weights that map the input span [in0, in1) of an axis of
// inSize pixels onto outSize pixels. Downsampling widens the kernel by the scale (so it averages
// over every input pixel it covers); each output weight set is normalised to sum to one in float64
// and then rounded half away from zero to precisionBits.
func computeCoeffs(inSize int, in0, in1 float32, outSize int, f Filter) axisCoeffs {
	scale := float64(in1-in0) / float64(outSize)
	filterScale := scale
	if filterScale < 1 {
		filterScale = 1
	}
	support := f.Support * filterScale
	ksize := int(math.Ceil(support))*2 + 1
	c := axisCoeffs{
		ksize: ksize,
		start: make([]int, outSize),
		count: make([]int, outSize),
		w:     make([]int32, outSize*ksize),
	}
	inv := 1 / filterScale
	tmp := make([]float64, ksize)
	for i := 0; i < outSize; i++ {
		// The centre of output pixel i in input coordinates (pixel centres at k+0.5).
		center := float64(in0) + float64((float64(i)+0.5)*scale)
		lo := int(center - support + 0.5)
		if lo < 0 {
			lo = 0
		}
		hi := int(center + support + 0.5)
		if hi > inSize {
			hi = inSize
		}
		n := hi - lo
		if n < 0 {
			n = 0
		}
		sum := 0.0
		for k := 0; k < n; k++ {
			w := f.Kernel(float64((float64(k+lo) - center + 0.5) * inv))
			tmp[k] = w
			sum += w
		}
		row := c.w[i*ksize : (i+1)*ksize]
		for k := 0; k < n; k++ {
			w := tmp[k]
			if sum != 0 {
				w /= sum
			}
			row[k] = fixedPoint(w)
		}
		c.start[i], c.count[i] = lo, n
	}
	return c
}

// fixedPoint rounds a normalised weight half away from zero to precisionBits.
func fixedPoint(w float64) int32 {
	v := w * (1 << precisionBits)
	if w < 0 {
		return int32(v - 0.5)
	}
	return int32(v + 0.5)
}

// clip8 turns a fixed-point accumulator into a pixel: floor to an integer, clamped to 0…255.
func clip8(acc int32) uint8 {
	v := acc >> precisionBits
	if v < 0 {
		return 0
	}
	if v > 255 {
		return 255
	}
	return uint8(v)
}

// Box is a source region in pixel coordinates (Pillow's `box` argument of resize).
type Box struct{ X0, Y0, X1, Y1 float32 }

// Resize resamples m to width × height with filter f, as Pillow's Image.resize(size, f) does for an
// RGB image: the horizontal pass first (only over the source rows the vertical pass will read),
// rounded to uint8, then the vertical pass. A pass whose axis keeps its size is skipped.
func Resize(m *Image, width, height int, f Filter) (*Image, error) {
	return ResizeBox(m, width, height, f, Box{0, 0, float32(m.Width), float32(m.Height)})
}

// ResizeBox resamples the region box of m to width × height (Pillow's resize with box=).
func ResizeBox(m *Image, width, height int, f Filter, box Box) (*Image, error) {
	return resizeWindow(m, width, height, f, box, window{0, 0, width, height})
}

// window is a rectangle of the output grid: [x0, x1) × [y0, y1).
type window struct{ x0, y0, x1, y1 int }

// resizeWindow computes only the window w of Resize's output. Output pixels of Pillow's resampler
// are independent of each other, so this equals resizing fully and cropping, at a fraction of the
// cost when most of the output would be cropped away.
func resizeWindow(m *Image, width, height int, f Filter, box Box, w window) (*Image, error) {
	if m == nil || m.Width <= 0 || m.Height <= 0 {
		return nil, fmt.Errorf("resize: %w: empty source image", ErrZeroSize)
	}
	if len(m.Pix) != m.Width*m.Height*3 {
		return nil, fmt.Errorf("resize: image has %d bytes for %dx%d", len(m.Pix), m.Width, m.Height)
	}
	if width <= 0 || height <= 0 {
		return nil, fmt.Errorf("resize: %w: target %dx%d", ErrZeroSize, width, height)
	}
	if f.Kernel == nil || f.Support <= 0 {
		return nil, fmt.Errorf("resize: filter %q has no kernel", f.Name)
	}
	if !(box.X0 >= 0 && box.Y0 >= 0 && box.X1 <= float32(m.Width) && box.Y1 <= float32(m.Height) &&
		box.X1 > box.X0 && box.Y1 > box.Y0) {
		return nil, fmt.Errorf("resize: box %v outside the %dx%d image", box, m.Width, m.Height)
	}
	if w.x0 < 0 || w.y0 < 0 || w.x1 > width || w.y1 > height || w.x1 <= w.x0 || w.y1 <= w.y0 {
		return nil, fmt.Errorf("resize: window %v outside the %dx%d output", w, width, height)
	}
	needH := width != m.Width || box.X0 != 0 || box.X1 != float32(width)
	needV := height != m.Height || box.Y0 != 0 || box.Y1 != float32(height)

	src := m
	// Source rows (of src) that output row y reads, relative to rowOffset.
	var vc axisCoeffs
	if needV {
		vc = computeCoeffs(m.Height, box.Y0, box.Y1, height, f)
	}
	if needH {
		hc := computeCoeffs(m.Width, box.X0, box.X1, width, f)
		// Rows the horizontal pass must produce: every row the vertical pass reads, or the
		// window's rows when there is no vertical pass.
		r0, r1 := w.y0, w.y1
		if needV {
			r0, r1 = vc.start[w.y0], 0
			for y := w.y0; y < w.y1; y++ {
				r0 = min(r0, vc.start[y])
				r1 = max(r1, vc.start[y]+vc.count[y])
			}
		}
		tmp := &Image{Width: w.x1 - w.x0, Height: r1 - r0, Pix: make([]uint8, (w.x1-w.x0)*(r1-r0)*3)}
		horizontalPass(tmp, m, r0, hc, w.x0)
		if !needV {
			return tmp, nil
		}
		// Shift the vertical pass onto tmp's rows.
		for y := range vc.start {
			vc.start[y] -= r0
		}
		src = tmp
		out := NewImage(w.x1-w.x0, w.y1-w.y0)
		verticalPass(out, src, vc, w.y0, 0)
		return out, nil
	}
	if needV {
		out := NewImage(w.x1-w.x0, w.y1-w.y0)
		verticalPass(out, src, vc, w.y0, w.x0)
		return out, nil
	}
	// Neither pass: a copy of the window.
	return cropExact(m, w.x0, w.y0, w.x1, w.y1), nil
}

// horizontalPass fills dst (one row per source row r0+y) with output columns x0 … x0+dst.Width-1.
// Each source row is first split into three int32 planes so the per-pixel sums are plain dot
// products. Sums are int32 as in Pillow; integer addition is associative, so the order of the
// terms does not change the result.
func horizontalPass(dst, src *Image, r0 int, c axisCoeffs, x0 int) {
	const half = int32(1) << (precisionBits - 1)
	planes := make([]int32, 3*src.Width)
	pr, pg, pb := planes[:src.Width], planes[src.Width:2*src.Width], planes[2*src.Width:]
	for y := 0; y < dst.Height; y++ {
		in := src.Pix[(r0+y)*src.Width*3 : (r0+y+1)*src.Width*3]
		for x := range pr {
			p := in[x*3 : x*3+3 : x*3+3]
			pr[x], pg[x], pb[x] = int32(p[0]), int32(p[1]), int32(p[2])
		}
		out := dst.Pix[y*dst.Width*3 : (y+1)*dst.Width*3]
		for x := 0; x < dst.Width; x++ {
			xx := x0 + x
			st, n := c.start[xx], c.count[xx]
			k := c.w[xx*c.ksize : xx*c.ksize+n]
			r, g, b := pr[st:st+n], pg[st:st+n], pb[st:st+n]
			r, g, b = r[:len(k)], g[:len(k)], b[:len(k)]
			s0, s1, s2 := half, half, half
			for i, kw := range k {
				s0 += r[i] * kw
				s1 += g[i] * kw
				s2 += b[i] * kw
			}
			o := out[x*3 : x*3+3 : x*3+3]
			o[0], o[1], o[2] = clip8(s0), clip8(s1), clip8(s2)
		}
	}
}

// verticalPass fills dst with output rows y0 … y0+dst.Height-1, reading src columns
// x0 … x0+dst.Width-1. Taps are applied four source rows at a time to cut accumulator traffic.
func verticalPass(dst, src *Image, c axisCoeffs, y0, x0 int) {
	const half = int32(1) << (precisionBits - 1)
	rowLen := dst.Width * 3
	acc := make([]int32, rowLen)
	row := func(sy int) []uint8 {
		off := (sy*src.Width + x0) * 3
		return src.Pix[off : off+rowLen]
	}
	for y := 0; y < dst.Height; y++ {
		yy := y0 + y
		for i := range acc {
			acc[i] = half
		}
		st, n := c.start[yy], c.count[yy]
		k := c.w[yy*c.ksize : yy*c.ksize+n]
		i := 0
		for ; i+4 <= n; i += 4 {
			k0, k1, k2, k3 := k[i], k[i+1], k[i+2], k[i+3]
			a, b, cc, d := row(st+i), row(st+i+1), row(st+i+2), row(st+i+3)
			a, b, cc, d = a[:len(acc)], b[:len(acc)], cc[:len(acc)], d[:len(acc)]
			for j := range acc {
				acc[j] += int32(a[j])*k0 + int32(b[j])*k1 + int32(cc[j])*k2 + int32(d[j])*k3
			}
		}
		for ; i < n; i++ {
			kw := k[i]
			a := row(st + i)
			a = a[:len(acc)]
			for j := range acc {
				acc[j] += int32(a[j]) * kw
			}
		}
		out := dst.Pix[y*rowLen : (y+1)*rowLen]
		out = out[:len(acc)]
		for j, v := range acc {
			out[j] = clip8(v)
		}
	}
}

// cropExact copies [x0, x1) × [y0, y1), all inside m.
func cropExact(m *Image, x0, y0, x1, y1 int) *Image {
	out := NewImage(x1-x0, y1-y0)
	for y := y0; y < y1; y++ {
		copy(out.Pix[(y-y0)*out.Width*3:(y-y0+1)*out.Width*3], m.Pix[(y*m.Width+x0)*3:(y*m.Width+x1)*3])
	}
	return out
}
