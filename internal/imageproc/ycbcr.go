package imageproc

import "image"

// YCbCr → RGB the way the C decoders behind Pillow do it. Go's image/jpeg and x/image/webp stop at
// the (subsampled) planes; how those become RGB is what libjpeg-turbo and libwebp define, and it
// differs between the two:
//   - JPEG (JFIF, full range): libjpeg's 16-bit fixed-point tables, chroma upsampled with its
//     "fancy" triangle filter for 2×1, 2×2 and 1×2 subsampling (replication otherwise).
//   - WebP (VP8, BT.601 limited range): libwebp's 14-bit MultHi formula with its fancy 4:2:0
//     upsampler (9-3-3-1 weights).

// libjpeg's fixed-point constants: FIX(x) = round(x · 2^16).
const (
	jFixCrR = 91881  // FIX(1.40200)
	jFixCbB = 116130 // FIX(1.77200)
	jFixCrG = 46802  // FIX(0.71414)
	jFixCbG = 22554  // FIX(0.34414)
	jHalf   = 1 << 15
)

func clampU8(v int32) uint8 {
	if v < 0 {
		return 0
	}
	if v > 255 {
		return 255
	}
	return uint8(v)
}

// jpegYCCToRGB converts one full-resolution sample as libjpeg's ycc_rgb_convert.
func jpegYCCToRGB(y, cb, cr uint8, dst []uint8) {
	yy := int32(y)
	x := int32(cr) - 128
	z := int32(cb) - 128
	dst[0] = clampU8(yy + (jFixCrR*x+jHalf)>>16)
	dst[1] = clampU8(yy + (-jFixCbG*z+jHalf-jFixCrG*x)>>16)
	dst[2] = clampU8(yy + (jFixCbB*z+jHalf)>>16)
}

// upsampleJPEGPlane returns a chroma plane (cw × ch valid samples at p[y*stride+x]) brought to
// w × h as libjpeg-turbo does for factors (fx, fy).
func upsampleJPEGPlane(p []uint8, stride, cw, ch, fx, fy, w, h int) []uint8 {
	out := make([]uint8, w*h)
	at := func(x, y int) int32 {
		x = min(max(x, 0), cw-1)
		y = min(max(y, 0), ch-1)
		return int32(p[y*stride+x])
	}
	switch {
	case fx == 1 && fy == 1:
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				out[y*w+x] = uint8(at(x, y))
			}
		}
	case fx == 2 && fy == 1 && cw >= 2:
		// h2v1_fancy_upsample: 3/4 nearer + 1/4 further, biases 1 and 2, edges replicated.
		row := make([]uint8, 2*cw)
		for y := 0; y < h; y++ {
			for cx := 0; cx < cw; cx++ {
				v := at(cx, y) * 3
				if cx == 0 {
					row[0] = uint8(at(0, y))
				} else {
					row[2*cx] = uint8((v + at(cx-1, y) + 1) >> 2)
				}
				if cx == cw-1 {
					row[2*cx+1] = uint8(at(cx, y))
				} else {
					row[2*cx+1] = uint8((v + at(cx+1, y) + 2) >> 2)
				}
			}
			copy(out[y*w:(y+1)*w], row)
		}
	case fx == 2 && fy == 2 && cw >= 2:
		// h2v2_fancy_upsample: vertical 3:1 column sums with the nearer other row (rows beyond the
		// edges replicated), then horizontal 3:1 with biases 8 and 7, edge columns ×4.
		row := make([]uint8, 2*cw)
		sums := make([]int32, cw)
		for y := 0; y < h; y++ {
			cy := y / 2
			other := cy - 1
			if y%2 == 1 {
				other = cy + 1
			}
			for cx := 0; cx < cw; cx++ {
				sums[cx] = at(cx, cy)*3 + at(cx, other)
			}
			for cx := 0; cx < cw; cx++ {
				t := sums[cx]
				if cx == 0 {
					row[0] = uint8((t*4 + 8) >> 4)
				} else {
					row[2*cx] = uint8((t*3 + sums[cx-1] + 8) >> 4)
				}
				if cx == cw-1 {
					row[2*cx+1] = uint8((t*4 + 7) >> 4)
				} else {
					row[2*cx+1] = uint8((t*3 + sums[cx+1] + 7) >> 4)
				}
			}
			copy(out[y*w:(y+1)*w], row)
		}
	case fx == 1 && fy == 2:
		// h1v2_fancy_upsample: 3:1 with the nearer other row, bias 1 above and 2 below.
		for y := 0; y < h; y++ {
			cy := y / 2
			other, bias := cy-1, int32(1)
			if y%2 == 1 {
				other, bias = cy+1, 2
			}
			for x := 0; x < w; x++ {
				out[y*w+x] = uint8((at(x, cy)*3 + at(x, other) + bias) >> 2)
			}
		}
	default:
		// Plain replication (libjpeg's int_upsample / h2v1 with a one-sample-wide plane).
		for y := 0; y < h; y++ {
			for x := 0; x < w; x++ {
				out[y*w+x] = uint8(at(x/fx, y/fy))
			}
		}
	}
	return out
}

// subsampleFactors returns the chroma subsampling of m as (horizontal, vertical) factors.
func subsampleFactors(r image.YCbCrSubsampleRatio) (int, int) {
	switch r {
	case image.YCbCrSubsampleRatio422:
		return 2, 1
	case image.YCbCrSubsampleRatio420:
		return 2, 2
	case image.YCbCrSubsampleRatio440:
		return 1, 2
	case image.YCbCrSubsampleRatio411:
		return 4, 1
	case image.YCbCrSubsampleRatio410:
		return 4, 2
	}
	return 1, 1
}

// jpegYCbCrToRGB converts a decoded JPEG's planes as libjpeg-turbo (default options) would.
func jpegYCbCrToRGB(m *image.YCbCr) *Image {
	b := m.Rect
	w, h := b.Dx(), b.Dy()
	fx, fy := subsampleFactors(m.SubsampleRatio)
	cw, ch := (w+fx-1)/fx, (h+fy-1)/fy
	c0 := m.COffset(b.Min.X, b.Min.Y)
	cb := upsampleJPEGPlane(m.Cb[c0:], m.CStride, cw, ch, fx, fy, w, h)
	cr := upsampleJPEGPlane(m.Cr[c0:], m.CStride, cw, ch, fx, fy, w, h)
	out := NewImage(w, h)
	for y := 0; y < h; y++ {
		yo := m.YOffset(b.Min.X, b.Min.Y+y)
		for x := 0; x < w; x++ {
			i := y*w + x
			jpegYCCToRGB(m.Y[yo+x], cb[i], cr[i], out.Pix[i*3:i*3+3])
		}
	}
	return out
}

// libwebp's YUV → RGB (BT.601 limited range, 14-bit constants, 6 fractional bits kept).
func webpClip8(v int32) uint8 {
	if v&^((256<<6)-1) == 0 {
		return uint8(v >> 6)
	}
	if v < 0 {
		return 0
	}
	return 255
}

func multHi(v, coeff int32) int32 { return (v * coeff) >> 8 }

func webpYUVToRGB(y, u, v int32, dst []uint8) {
	dst[0] = webpClip8(multHi(y, 19077) + multHi(v, 26149) - 14234)
	dst[1] = webpClip8(multHi(y, 19077) - multHi(u, 6419) - multHi(v, 13320) + 8708)
	dst[2] = webpClip8(multHi(y, 19077) + multHi(u, 33050) - 17685)
}

// webpUpsampleRow converts one output row with libwebp's fancy upsampler: near is the chroma row
// closest to the output row, far the other one (equal at the top and bottom edges). u and v are
// packed into one uint32 (u low, v high) as libwebp does, so the rounding is the same.
func webpUpsampleRow(yrow []uint8, nearU, nearV, farU, farV []uint8, dst []uint8) {
	w := len(yrow)
	load := func(u, v []uint8, i int) uint32 { return uint32(u[i]) | uint32(v[i])<<16 }
	emit := func(x int, uv uint32) {
		webpYUVToRGB(int32(yrow[x]), int32(uv&0xff), int32(uv>>16), dst[x*3:x*3+3])
	}
	tl, l := load(farU, farV, 0), load(nearU, nearV, 0)
	emit(0, (3*l+tl+0x00020002)>>2)
	for x := 1; x <= (w-1)>>1; x++ {
		t, c := load(farU, farV, x), load(nearU, nearV, x)
		avg := tl + t + l + c + 0x00080008
		// Seen from the near row: diag_03 pairs the far-left with the near sample, diag_12 the
		// far sample with the near-left one.
		diag12 := (avg + 2*(t+l)) >> 3
		diag03 := (avg + 2*(tl+c)) >> 3
		emit(2*x-1, (diag03+l)>>1)
		emit(2*x, (diag12+c)>>1)
		tl, l = t, c
	}
	if w&1 == 0 {
		emit(w-1, (3*l+tl+0x00020002)>>2)
	}
}

// webpYCbCrToRGB converts a decoded lossy WebP's 4:2:0 planes as libwebp (default, fancy
// upsampling) would.
func webpYCbCrToRGB(m *image.YCbCr) *Image {
	b := m.Rect
	w, h := b.Dx(), b.Dy()
	if m.SubsampleRatio != image.YCbCrSubsampleRatio420 {
		return jpegYCbCrToRGB(m) // not produced by VP8; keep a sane fallback
	}
	cw, ch := (w+1)/2, (h+1)/2
	c0 := m.COffset(b.Min.X, b.Min.Y)
	crow := func(p []uint8, cy int) []uint8 {
		cy = min(max(cy, 0), ch-1)
		return p[c0+cy*m.CStride : c0+cy*m.CStride+cw]
	}
	out := NewImage(w, h)
	for y := 0; y < h; y++ {
		yo := m.YOffset(b.Min.X, b.Min.Y+y)
		// Output row y sits between chroma rows (y-1)/2 and (y+1)/2 (its nearer one is y/2…):
		// libwebp pairs rows 2k-1 (top, nearer to chroma row k-1) and 2k (bottom, nearer to k).
		var near, far int
		if y == 0 {
			near, far = 0, 0
		} else if y%2 == 1 {
			near, far = (y-1)/2, (y+1)/2
		} else {
			near, far = y/2, y/2-1
		}
		if far >= ch { // last row of an even-height image: mirrored
			far = near
		}
		webpUpsampleRow(m.Y[yo:yo+w], crow(m.Cb, near), crow(m.Cr, near), crow(m.Cb, far), crow(m.Cr, far),
			out.Pix[y*w*3:(y+1)*w*3])
	}
	return out
}
