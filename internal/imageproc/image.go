package imageproc

import "fmt"

// Image is an 8-bit RGB image in row-major HWC layout: 3 bytes per pixel, rows without padding,
// the layout of a numpy array `np.array(pil_image.convert("RGB"))`.
type Image struct {
	Width, Height int
	Pix           []uint8 // len = Height*Width*3
}

// NewImage returns a black image of the given size.
func NewImage(width, height int) *Image {
	return &Image{Width: width, Height: height, Pix: make([]uint8, width*height*3)}
}

// FromHWC wraps pix (height × width × 3, uint8) as an Image without copying.
func FromHWC(pix []uint8, height, width int) (*Image, error) {
	if width <= 0 || height <= 0 {
		return nil, fmt.Errorf("image from hwc: %w: %dx%d", ErrZeroSize, width, height)
	}
	if len(pix) != width*height*3 {
		return nil, fmt.Errorf("image from hwc: %d bytes for %dx%dx3", len(pix), height, width)
	}
	return &Image{Width: width, Height: height, Pix: pix}, nil
}

// Clone returns a deep copy of m.
func (m *Image) Clone() *Image {
	return &Image{Width: m.Width, Height: m.Height, Pix: append([]uint8(nil), m.Pix...)}
}

// RGB returns the pixel at column x, row y.
func (m *Image) RGB(x, y int) (r, g, b uint8) {
	i := (y*m.Width + x) * 3
	return m.Pix[i], m.Pix[i+1], m.Pix[i+2]
}

// ToCHWFloat returns the image as a [3, H, W] float32 tensor with (v*scale - mean[c]) / std[c]
// per channel; SigLIP's processor uses scale 1/255 and mean = std = 0.5, the VAE input
// (v/127.5 - 1) is scale 1/127.5, mean 1, std 1.
func (m *Image) ToCHWFloat(scale float64, mean, std [3]float64) []float32 {
	n := m.Width * m.Height
	out := make([]float32, 3*n)
	for c := 0; c < 3; c++ {
		dst := out[c*n : (c+1)*n]
		for i := range dst {
			v := float64(m.Pix[i*3+c])*scale - mean[c]
			dst[i] = float32(v / std[c])
		}
	}
	return out
}
