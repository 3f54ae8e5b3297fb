package imageproc

import (
	"fmt"
	"math"
)

// CoverSize returns the size FramePack resizes a width × height image to before its centre crop to
// targetWidth × targetHeight: scaled by max(tw/w, th/h), each side rounded half to even (Python's
// round), so the result covers the target.
func CoverSize(width, height, targetWidth, targetHeight int) (int, int) {
	scale := math.Max(float64(targetWidth)/float64(width), float64(targetHeight)/float64(height))
	rw := int(math.RoundToEven(float64(float64(width) * scale)))
	rh := int(math.RoundToEven(float64(float64(height) * scale)))
	return rw, rh
}

// CenterCropBox returns the integer crop box Pillow uses for FramePack's float centre box
// ((W−tw)/2, (H−th)/2, (W+tw)/2, (H+th)/2): each coordinate rounded half to even. When W−tw is odd
// and tw is odd the box is one pixel wider than tw (and likewise for the height), exactly as in the
// reference.
func CenterCropBox(width, height, targetWidth, targetHeight int) (x0, y0, x1, y1 int) {
	half := func(v int) int { return int(math.RoundToEven(float64(v) / 2)) }
	return half(width - targetWidth), half(height - targetHeight), half(width + targetWidth), half(height + targetHeight)
}

// ResizeAndCenterCrop is FramePack's resize_and_center_crop: an image already of the target size
// is returned as is (a copy); otherwise it is LANCZOS-resized to cover the target (CoverSize) and
// centre-cropped (CenterCropBox). Only the pixels that survive the crop are computed.
func ResizeAndCenterCrop(m *Image, targetWidth, targetHeight int) (*Image, error) {
	if m == nil || m.Width <= 0 || m.Height <= 0 {
		return nil, fmt.Errorf("resize and center crop: %w: empty source image", ErrZeroSize)
	}
	if targetWidth <= 0 || targetHeight <= 0 {
		return nil, fmt.Errorf("resize and center crop: %w: target %dx%d", ErrZeroSize, targetWidth, targetHeight)
	}
	if m.Width == targetWidth && m.Height == targetHeight {
		return m.Clone(), nil
	}
	rw, rh := CoverSize(m.Width, m.Height, targetWidth, targetHeight)
	if rw <= 0 || rh <= 0 || int64(rw)*int64(rh) > 1<<31 {
		return nil, fmt.Errorf("resize and center crop: cover size %dx%d out of range", rw, rh)
	}
	x0, y0, x1, y1 := CenterCropBox(rw, rh, targetWidth, targetHeight)
	// The window of the resized image that the crop keeps; anything outside is black (Pillow's crop
	// pads with zeros), which a cover resize never needs in practice.
	wx0, wy0, wx1, wy1 := max(x0, 0), max(y0, 0), min(x1, rw), min(y1, rh)
	if wx1 <= wx0 || wy1 <= wy0 {
		return NewImage(x1-x0, y1-y0), nil
	}
	inner, err := resizeWindow(m, rw, rh, Lanczos, Box{0, 0, float32(m.Width), float32(m.Height)},
		window{wx0, wy0, wx1, wy1})
	if err != nil {
		return nil, fmt.Errorf("resize and center crop: %w", err)
	}
	if wx0 == x0 && wy0 == y0 && wx1 == x1 && wy1 == y1 {
		return inner, nil
	}
	out := NewImage(x1-x0, y1-y0)
	for y := wy0; y < wy1; y++ {
		dst := out.Pix[((y-y0)*out.Width+(wx0-x0))*3:]
		copy(dst[:(wx1-wx0)*3], inner.Pix[(y-wy0)*inner.Width*3:(y-wy0+1)*inner.Width*3])
	}
	return out, nil
}

// SiglipResize is the resize step of transformers' SiglipImageProcessor: BICUBIC (Pillow) straight
// to size × size, ignoring the aspect ratio.
func SiglipResize(m *Image, width, height int) (*Image, error) {
	out, err := Resize(m, width, height, Bicubic)
	if err != nil {
		return nil, fmt.Errorf("siglip resize: %w", err)
	}
	return out, nil
}
