package siglip

import (
	"fmt"
	"math"

	"github.com/framepackd/framepackd/internal/imageproc"
)

// Torchvision's resize of a uint8 image tensor on the CPU (torchvision.transforms.v2.functional.
// resize with antialias=True, the default of transformers 5's torchvision image processors) runs
// PyTorch's native uint8 kernel (aten/src/ATen/native/cpu/UpSampleKernel.cpp,
// _upsample_bicubic2d_aa: the AVX2 kernels of UpSampleKernelmaxAVXAntialias.h or the generic
// separable loop, which agree). It is Pillow's algorithm — a horizontal pass rounded to uint8,
// then a vertical pass, each output pixel a normalised filter window that is widened by the scale
// when downsampling — with two differences that move some pixels by one level:
//
//   - the weights are quantised to int16 with a per-axis precision chosen so that the largest
//     weight fits (about 15 bits, where Pillow uses 22 bits in int32), and
//   - the filter is evaluated in PyTorch's form of the cubic convolution (a = −0.5 with
//     antialiasing, as Pillow; a = −0.75 is only the non-antialiased path, which is not used).
//
// Output pixel i of an axis of scale s = in/out reads the inputs [xmin, xmin+n) around
// center = s·(i+0.5) with support 2·max(s, 1), weights filter((j + xmin − center + 0.5)/max(s, 1))
// normalised to sum 1; accumulation is integer: (2^(p−1) + Σ v·w) >> p, clamped to 0…255.

// torchCubic is HelperInterpCubic::aa_filter with a = −0.5 (antialias=True).
func torchCubic(x float64) float64 {
	const a = -0.5
	x = math.Abs(x)
	if x < 1 {
		return ((a+2)*x-(a+3))*x*x + 1
	}
	if x < 2 {
		return ((a*x-5*a)*x+8*a)*x - 4*a
	}
	return 0
}

// torchAxis is the int16-quantised weights of one axis.
type torchAxis struct {
	ksize      int
	xmin, size []int
	w          []int32 // int16 values, ksize per output
	precision  uint
}

// torchAxisWeights is HelperInterpBase::_compute_index_ranges_int16_weights for the bicubic
// antialiased filter (interp_size 4) with align_corners=False and no explicit scale.
func torchAxisWeights(inSize, outSize int) torchAxis {
	scale := float64(inSize) / float64(outSize) // area_pixel_compute_scale
	const interpSize = 4
	support := interpSize * 0.5
	if scale >= 1 {
		support *= scale
	}
	ksize := int(math.Ceil(support))*2 + 1
	invscale := 1.0
	if scale >= 1 {
		invscale = 1 / scale
	}
	ax := torchAxis{ksize: ksize, xmin: make([]int, outSize), size: make([]int, outSize), w: make([]int32, outSize*ksize)}
	wf := make([]float64, outSize*ksize)
	wtMax := 0.0
	for i := 0; i < outSize; i++ {
		center := scale * (float64(i) + 0.5)
		xmin := max(int64(center-support+0.5), 0) // static_cast<int64_t> truncates
		xsize := min(int64(center+support+0.5), int64(inSize)) - xmin
		xsize = min(max(xsize, 0), int64(ksize))
		row := wf[i*ksize : (i+1)*ksize]
		total := 0.0
		for j := int64(0); j < xsize; j++ {
			w := torchCubic((float64(j+xmin) - center + 0.5) * invscale)
			row[j] = w
			total += w
		}
		if total != 0 {
			for j := int64(0); j < xsize; j++ {
				row[j] /= total
				wtMax = max(wtMax, row[j])
			}
		}
		ax.xmin[i], ax.size[i] = int(xmin), int(xsize)
	}
	var p uint
	for p = 0; p < 22; p++ {
		if int(0.5+wtMax*float64(int(1)<<(p+1))) >= 1<<15 {
			break
		}
	}
	ax.precision = p
	for k, v := range wf {
		v *= float64(int(1) << p)
		if v < 0 {
			ax.w[k] = int32(int16(int(-0.5 + v)))
		} else {
			ax.w[k] = int32(int16(int(0.5 + v)))
		}
	}
	return ax
}

// clampShift is the kernels' final step: arithmetic shift, then saturation to uint8.
func clampShift(acc int32, p uint) uint8 {
	v := acc >> p
	if v < 0 {
		return 0
	}
	if v > 255 {
		return 255
	}
	return uint8(v)
}

// TorchResizeBicubic resizes an RGB image as torchvision.transforms.v2.functional.resize does for
// a uint8 tensor on the CPU with InterpolationMode.BICUBIC and antialias=True (see the comment at
// the top of this file). An axis that keeps its size is not resampled.
func TorchResizeBicubic(m *imageproc.Image, width, height int) (*imageproc.Image, error) {
	if m == nil || m.Width <= 0 || m.Height <= 0 || len(m.Pix) != m.Width*m.Height*3 {
		return nil, fmt.Errorf("torch resize: bad source image")
	}
	if width <= 0 || height <= 0 {
		return nil, fmt.Errorf("torch resize: bad size %dx%d", width, height)
	}
	src := m
	if width != src.Width {
		ax := torchAxisWeights(src.Width, width)
		dst := imageproc.NewImage(width, src.Height)
		half := int32(1) << (ax.precision - 1)
		for y := 0; y < src.Height; y++ {
			in := src.Pix[y*src.Width*3 : (y+1)*src.Width*3]
			out := dst.Pix[y*width*3 : (y+1)*width*3]
			for x := 0; x < width; x++ {
				w := ax.w[x*ax.ksize : x*ax.ksize+ax.size[x]]
				r, g, b := half, half, half
				base := ax.xmin[x] * 3
				for k, wk := range w {
					px := in[base+3*k : base+3*k+3]
					r += int32(px[0]) * wk
					g += int32(px[1]) * wk
					b += int32(px[2]) * wk
				}
				out[3*x] = clampShift(r, ax.precision)
				out[3*x+1] = clampShift(g, ax.precision)
				out[3*x+2] = clampShift(b, ax.precision)
			}
		}
		src = dst
	}
	if height != src.Height {
		ax := torchAxisWeights(src.Height, height)
		dst := imageproc.NewImage(src.Width, height)
		half := int32(1) << (ax.precision - 1)
		stride := src.Width * 3
		acc := make([]int32, stride)
		for y := 0; y < height; y++ {
			for i := range acc {
				acc[i] = half
			}
			w := ax.w[y*ax.ksize : y*ax.ksize+ax.size[y]]
			for k, wk := range w {
				row := src.Pix[(ax.xmin[y]+k)*stride : (ax.xmin[y]+k+1)*stride]
				for i, v := range row {
					acc[i] += int32(v) * wk
				}
			}
			out := dst.Pix[y*stride : (y+1)*stride]
			for i, a := range acc {
				out[i] = clampShift(a, ax.precision)
			}
		}
		src = dst
	}
	if src == m {
		return m.Clone(), nil
	}
	return src, nil
}
