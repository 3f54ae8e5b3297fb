// Package latentpreview is FramePack's vae_decode_fake: the fixed 16 → 3 linear map that turns
// sampler latents into a rough RGB preview without the VAE. It is plain Go with no runtime, so
// the supervisor (which must not link the native runtime) and the VAE worker share one copy of
// the matrix.
package latentpreview

import (
	"errors"
	"fmt"
)

// Channels is the latent channel count the map accepts.
const Channels = 16

// ErrBadInput reports latents of the wrong shape.
var ErrBadInput = errors.New("latent preview: bad input")

// rgbFactors is FramePack's vae_decode_fake map (from ComfyUI): row c is latent channel c's
// contribution to R, G, B.
var rgbFactors = [Channels][3]float32{
	{-0.0395, -0.0331, 0.0445},
	{0.0696, 0.0795, 0.0518},
	{0.0135, -0.0945, -0.0282},
	{0.0108, -0.0250, -0.0765},
	{-0.0209, 0.0032, 0.0224},
	{-0.0804, -0.0254, -0.0639},
	{-0.0991, 0.0271, -0.0669},
	{-0.0646, -0.0422, -0.0400},
	{-0.0696, -0.0595, -0.0894},
	{-0.0799, -0.0208, -0.0375},
	{0.1166, 0.1627, 0.0962},
	{0.1165, 0.0432, 0.0407},
	{-0.2315, -0.1920, -0.1355},
	{-0.0270, 0.0401, -0.0821},
	{-0.0616, -0.0997, -0.0727},
	{0.0249, -0.0469, -0.1703},
}

// rgbBias is vae_decode_fake's bias per output channel.
var rgbBias = [3]float32{0.0259, -0.0192, -0.0761}

// DecodeFake maps latents [B, 16, T, h, w] (as the sampler holds them, scaled) to RGB
// [B, 3, T, h, w] clamped to [0, 1]; shape is the latents' shape and the result has shape
// [B, 3, T, h, w].
func DecodeFake(shape [5]int, latents []float32) ([]float32, error) {
	for _, d := range shape {
		if d < 0 {
			return nil, fmt.Errorf("%w: shape %v", ErrBadInput, shape)
		}
	}
	if shape[1] != Channels {
		return nil, fmt.Errorf("%w: preview needs %d latent channels, got %d", ErrBadInput, Channels, shape[1])
	}
	plane := shape[2] * shape[3] * shape[4]
	if len(latents) != shape[0]*Channels*plane {
		return nil, fmt.Errorf("%w: %d values for shape %v", ErrBadInput, len(latents), shape)
	}
	out := make([]float32, shape[0]*3*plane)
	acc := make([]float32, plane)
	for b := range shape[0] {
		in := latents[b*Channels*plane : (b+1)*Channels*plane]
		for o := range 3 {
			clear(acc)
			for c := range Channels {
				w := rgbFactors[c][o]
				for i, v := range in[c*plane : (c+1)*plane] {
					acc[i] += w * v
				}
			}
			dst := out[(b*3+o)*plane : (b*3+o+1)*plane]
			for i, v := range acc {
				dst[i] = min(max(v+rgbBias[o], 0), 1)
			}
		}
	}
	return out, nil
}
