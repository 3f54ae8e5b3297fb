package imageproc

import "testing"

func benchImage(w, h int) *Image {
	m := NewImage(w, h)
	for y := 0; y < h; y++ {
		for x := 0; x < w; x++ {
			i := (y*w + x) * 3
			m.Pix[i], m.Pix[i+1], m.Pix[i+2] = uint8(x*7+y), uint8(x^y), uint8((x*y)>>3)
		}
	}
	return m
}

// BenchmarkLanczosCover1080p is the start-frame preparation of a 1080p input: LANCZOS resize to
// cover the 544×704 bucket (967×544) and centre crop to 704×544. Run with -cpu 1 for the
// single-core figure in docs/PERFORMANCE.md.
func BenchmarkLanczosCover1080p(b *testing.B) {
	src := benchImage(1920, 1080)
	b.SetBytes(int64(len(src.Pix)))
	for b.Loop() {
		out, err := ResizeAndCenterCrop(src, 704, 544)
		if err != nil || out.Width != 704 || out.Height != 544 {
			b.Fatal(err)
		}
	}
}

// BenchmarkLanczosResize1080pFull is the same resize without cropping (all 967×544 pixels), the
// work Pillow does before its crop.
func BenchmarkLanczosResize1080pFull(b *testing.B) {
	src := benchImage(1920, 1080)
	b.SetBytes(int64(len(src.Pix)))
	for b.Loop() {
		if _, err := Resize(src, 967, 544, Lanczos); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSiglipBicubic384 is SigLIP's preprocessing resize of a prepared 704×544 frame to 384².
func BenchmarkSiglipBicubic384(b *testing.B) {
	src := benchImage(704, 544)
	for b.Loop() {
		if _, err := SiglipResize(src, 384, 384); err != nil {
			b.Fatal(err)
		}
	}
}
