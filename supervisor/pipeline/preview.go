package pipeline

import (
	"bytes"
	"fmt"
	"image"
	"image/png"

	"github.com/framepackd/framepackd/internal/latentpreview"
)

// previewPNG is demo_gradio.py's sampling preview of the denoised latents in a segment:
// vae_decode_fake (a fixed 16 → 3 map, clamped to [0, 1]), ×255 truncated to uint8, and the
// frames laid side by side ('b c t h w -> (b h) (t w) c'), PNG-encoded.
func previewPNG(path, name string) ([]byte, error) {
	lat, err := readSegmentVol(path, name)
	if err != nil {
		return nil, fmt.Errorf("preview: %w", err)
	}
	return previewOf(lat)
}

func previewOf(lat vol) ([]byte, error) {
	s := lat.Shape()
	data, err := latentpreview.DecodeFake(s, lat.Data)
	if err != nil {
		return nil, fmt.Errorf("preview: %w", err)
	}
	b, t, h, w := s[0], s[2], s[3], s[4] // data: [B, 3, T, h, w]
	img := image.NewNRGBA(image.Rect(0, 0, t*w, b*h))
	for bi := range b {
		for c := range 3 {
			for ti := range t {
				plane := data[((bi*3+c)*t+ti)*h*w:][:h*w]
				for y := range h {
					row := img.Pix[(bi*h+y)*img.Stride:]
					for x := range w {
						v := plane[y*w+x] * 255
						row[(ti*w+x)*4+c] = uint8(min(max(v, 0), 255))
					}
				}
			}
		}
	}
	for i := 3; i < len(img.Pix); i += 4 {
		img.Pix[i] = 255
	}
	var buf bytes.Buffer
	if err := (&png.Encoder{CompressionLevel: png.BestSpeed}).Encode(&buf, img); err != nil {
		return nil, fmt.Errorf("preview: %w", err)
	}
	return buf.Bytes(), nil
}
