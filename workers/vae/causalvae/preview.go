package causalvae

import (
	"errors"
	"fmt"

	"github.com/framepackd/framepackd/internal/latentpreview"
)

// PreviewChannels is the latent channel count DecodeFake accepts.
const PreviewChannels = latentpreview.Channels

// DecodeFake is FramePack's vae_decode_fake, the preview shown while sampling: a fixed
// 16→3 linear map of every latent pixel, clamped to [0, 1]. latents [B, 16, T, h, w] (as the
// sampler holds them, scaled) → RGB [B, 3, T, h, w]. It needs no weights and no runtime; the
// map lives in internal/latentpreview, which the supervisor uses too.
func DecodeFake(latents Volume) (Volume, error) {
	s := latents.Shape
	rgb, err := latentpreview.DecodeFake(s, latents.Data)
	if errors.Is(err, latentpreview.ErrBadInput) {
		return Volume{}, fmt.Errorf("%w: %w", ErrBadInput, err)
	}
	if err != nil {
		return Volume{}, err
	}
	return Volume{Shape: [5]int{s[0], 3, s[2], s[3], s[4]}, Data: rgb}, nil
}
