package pipeline

import (
	"bytes"
	"errors"
	"fmt"
	"image"
	"image/jpeg"
	"os"

	"golang.org/x/image/draw"

	"github.com/framepackd/framepackd/internal/imageproc"
)

// thumbnailSide bounds a thumbnail's longer side, in pixels.
const thumbnailSide = 320

// writeThumbnail writes the middle frame of pixels (a section's newest frames), scaled down to
// fit thumbnailSide (never up), as a JPEG at path: written to path.partial and renamed, so a
// reader never sees half a file. It is what the page's gallery shows (jobs.Dir.Thumbnail).
func writeThumbnail(path string, pixels vol) error {
	if pixels.T < 1 {
		return errors.New("thumbnail: no frames")
	}
	f, err := imageproc.VideoFrames(sliceT(pixels, pixels.T/2, pixels.T/2+1))
	if err != nil {
		return fmt.Errorf("thumbnail: %w", err)
	}
	if f.T < 1 || f.H < 1 || f.W < 1 || f.C != 3 || len(f.Pix) < f.T*f.H*f.W*3 {
		return errors.New("thumbnail: no RGB frames")
	}
	frame := f.Pix[(f.T/2)*f.H*f.W*3:][:f.H*f.W*3]
	src := image.NewRGBA(image.Rect(0, 0, f.W, f.H))
	for i := range f.H * f.W {
		copy(src.Pix[4*i:4*i+3], frame[3*i:3*i+3])
		src.Pix[4*i+3] = 0xff
	}
	var img image.Image = src
	if side := max(f.H, f.W); side > thumbnailSide {
		w, h := max(f.W*thumbnailSide/side, 1), max(f.H*thumbnailSide/side, 1)
		dst := image.NewRGBA(image.Rect(0, 0, w, h))
		draw.CatmullRom.Scale(dst, dst.Bounds(), src, src.Bounds(), draw.Src, nil)
		img = dst
	}
	var buf bytes.Buffer
	if err := jpeg.Encode(&buf, img, &jpeg.Options{Quality: 85}); err != nil {
		return fmt.Errorf("thumbnail: %w", err)
	}
	if err := os.WriteFile(path+".partial", buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("thumbnail: %w", err)
	}
	if err := os.Rename(path+".partial", path); err != nil {
		_ = os.Remove(path + ".partial")
		return fmt.Errorf("thumbnail: %w", err)
	}
	return nil
}
