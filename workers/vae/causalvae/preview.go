package causalvae

import "fmt"

// latentRGBFactors is FramePack's vae_decode_fake map (from ComfyUI): row c is latent channel
// c's contribution to R, G, B.
var latentRGBFactors = [16][3]float32{
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

// latentRGBBias is vae_decode_fake's bias per output channel.
var latentRGBBias = [3]float32{0.0259, -0.0192, -0.0761}

// PreviewChannels is the latent channel count DecodeFake accepts.
const PreviewChannels = 16

// DecodeFake is FramePack's vae_decode_fake, the preview shown while sampling: a fixed
// 16→3 linear map of every latent pixel, clamped to [0, 1]. latents [B, 16, T, h, w] (as the
// sampler holds them, scaled) → RGB [B, 3, T, h, w]. It needs no weights and no runtime.
func DecodeFake(latents Volume) (Volume, error) {
	s := latents.Shape
	if s[1] != PreviewChannels {
		return Volume{}, fmt.Errorf("%w: preview needs %d latent channels, got %d", ErrBadInput, PreviewChannels, s[1])
	}
	if len(latents.Data) != numel5(s) {
		return Volume{}, fmt.Errorf("%w: %d values for shape %v", ErrBadInput, len(latents.Data), s)
	}
	out := NewVolume([5]int{s[0], 3, s[2], s[3], s[4]})
	plane := s[2] * s[3] * s[4]
	acc := make([]float32, plane)
	for b := range s[0] {
		in := latents.Data[b*PreviewChannels*plane : (b+1)*PreviewChannels*plane]
		for o := range 3 {
			for i := range acc {
				acc[i] = 0
			}
			for c := range PreviewChannels {
				w := latentRGBFactors[c][o]
				src := in[c*plane : (c+1)*plane]
				for i, v := range src {
					acc[i] += w * v
				}
			}
			dst := out.Data[(b*3+o)*plane : (b*3+o+1)*plane]
			for i, v := range acc {
				dst[i] = min(max(v+latentRGBBias[o], 0), 1)
			}
		}
	}
	return out, nil
}
