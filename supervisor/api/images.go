package api

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"

	"github.com/framepackd/framepackd/internal/imageproc"
)

// DefaultMaxConcurrentDecodes is how many submitted images the server decodes at once when
// Config.MaxConcurrentDecodes is 0; the others wait. A decode of a large image holds about
// 7 bytes a pixel (the decoder's RGBA plus the RGB copy), so this bounds the daemon's memory
// under a burst of uploads.
const DefaultMaxConcurrentDecodes = 2

// freeAfterPixels is the image size above which the memory of a finished decode is handed
// back to the system at once instead of at the next garbage collection.
const freeAfterPixels = 4_000_000

// decoder returns the image check SubmitJob uses: Config.DecodeImage (or a decode limited to
// Config.MaxImagePixels), run by at most MaxConcurrentDecodes calls at a time; a call that
// waits longer than ctx is refused.
func (s *Server) decoder(ctx context.Context) func([]byte) (int, int, error) {
	return func(data []byte) (int, int, error) {
		select {
		case s.decodeSem <- struct{}{}:
		case <-ctx.Done():
			return 0, 0, fmt.Errorf("waiting to decode: %w", ctx.Err())
		}
		w, h, err := s.cfg.DecodeImage(data)
		<-s.decodeSem
		if errors.Is(err, imageproc.ErrTooLarge) {
			err = fmt.Errorf("%w; the server takes at most %d pixels (framepackd --max-image-pixels): scale the image down, the video is at most about 640x640 anyway", err, s.cfg.MaxImagePixels)
		}
		if int64(w)*int64(h) > freeAfterPixels {
			debug.FreeOSMemory()
		}
		return w, h, err
	}
}

// decodeLimited is DecodeImage with the server's pixel limit.
func decodeLimited(maxPixels int64) func([]byte) (int, int, error) {
	return func(data []byte) (int, int, error) {
		img, _, err := imageproc.Decode(data, imageproc.Options{MaxPixels: maxPixels})
		if err != nil {
			return 0, 0, err
		}
		return img.Width, img.Height, nil
	}
}
