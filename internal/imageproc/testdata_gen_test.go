package imageproc

import (
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteGoTestdata writes the PNGs of testdata/decode that Pillow cannot write (16-bit RGB,
// RGBA and gray+alpha, 16-bit gray with tRNS). It runs only with IMAGEPROC_WRITE_TESTDATA=1; the
// files are committed, and testdata/gen_decode.py records Pillow's reading of them.
func TestWriteGoTestdata(t *testing.T) {
	if os.Getenv("IMAGEPROC_WRITE_TESTDATA") != "1" {
		t.Skip("set IMAGEPROC_WRITE_TESTDATA=1 to regenerate testdata/decode/go_*.png")
	}
	dir := filepath.Join("testdata", "decode")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	const w, h = 13, 9
	v16 := func(x, y, c int) uint16 { return uint16((x*5003 + y*7919 + c*30011) % 65536) }
	rgb16 := image.NewRGBA64(image.Rect(0, 0, w, h))
	rgba16 := image.NewNRGBA64(image.Rect(0, 0, w, h))
	la16 := image.NewNRGBA64(image.Rect(0, 0, w, h))
	g16 := image.NewGray16(image.Rect(0, 0, w, h))
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			rgb16.SetRGBA64(x, y, color.RGBA64{v16(x, y, 0), v16(x, y, 1), v16(x, y, 2), 0xffff})
			rgba16.SetNRGBA64(x, y, color.NRGBA64{v16(x, y, 0), v16(x, y, 1), v16(x, y, 2), v16(x, y, 3)})
			g := v16(x, y, 0)
			la16.SetNRGBA64(x, y, color.NRGBA64{g, g, g, uint16(x * 5000)})
			if (x+y)%3 == 0 {
				g = uint16(x * y) // some values below 256, which survive Pillow's I;16 clamp
			}
			g16.SetGray16(x, y, color.Gray16{g})
		}
	}
	write := func(name string, m image.Image) {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := png.Encode(f, m); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write("go_rgb16.png", rgb16)
	write("go_rgba16.png", rgba16)
	write("go_gray16.png", g16)
	// Go's encoder writes gray+alpha 16-bit as RGBA 16-bit; that is still the high-byte rule.
	write("go_la16.png", la16)
}
