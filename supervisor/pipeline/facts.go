package pipeline

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/framepackd/framepackd/internal/workerkit"
)

// The supervisor reads no model config.json: what it must know about a model (the VAE's
// scaling factor and latent layout, the transformer's patch sizes and latent channels) comes
// from the worker's LoadResponse (lanes.Report.Loaded), checked against what the job holds.

// vaeFacts checks a VAE worker's model facts against the latents it returned and returns its
// scaling factor (and the shortest decimal that prints it, for the conditioning file).
func vaeFacts(loaded *workerkit.LoadResponse, latents vol, height, width int) (float32, string, error) {
	if loaded == nil || loaded.VAE == nil {
		return 0, "", errors.New("the vae worker reported no model facts (LoadResponse.vae)")
	}
	v := loaded.VAE
	if !(v.ScalingFactor > 0) {
		return 0, "", fmt.Errorf("the vae worker reported scaling_factor %g", v.ScalingFactor)
	}
	if int(v.LatentChannels) != latents.C {
		return 0, "", fmt.Errorf("the vae reports %d latent channels, its encoder returned %d", v.LatentChannels, latents.C)
	}
	if r := int(v.SpatialCompressionRatio); r < 1 || latents.H*r != height || latents.W*r != width {
		return 0, "", fmt.Errorf("the vae reports spatial compression %d, its latent is %dx%d for a %dx%d frame", r, latents.W, latents.H, width, height)
	}
	sf := float32(v.ScalingFactor)
	return sf, strconv.FormatFloat(float64(sf), 'g', -1, 32), nil
}

// checkTransformerFacts checks a transformer worker's model facts against the job's latents:
// same channels, latent height and width multiples of the patch size.
func checkTransformerFacts(loaded *workerkit.LoadResponse, latents vol) error {
	if loaded == nil || loaded.Transformer == nil {
		return errors.New("the transformer worker reported no model facts (LoadResponse.transformer)")
	}
	t := loaded.Transformer
	if int(t.InChannels) != latents.C || int(t.OutChannels) != latents.C {
		return fmt.Errorf("%w: the transformer takes %d and returns %d latent channels, the vae's latents have %d",
			errBadInput, t.InChannels, t.OutChannels, latents.C)
	}
	if p := int(t.PatchSize); p < 1 || latents.H%p != 0 || latents.W%p != 0 {
		return fmt.Errorf("%w: latent %dx%d is not a multiple of the transformer's patch size %d (choose another bucket)",
			errBadInput, latents.W, latents.H, t.PatchSize)
	}
	if t.PatchSizeT != 1 {
		return fmt.Errorf("the transformer's temporal patch size is %d; the section loop needs 1", t.PatchSizeT)
	}
	return nil
}

// parseScalingFactor reads the scaling factor a conditioning file recorded.
func parseScalingFactor(s string) (float32, error) {
	f, err := strconv.ParseFloat(s, 32)
	if err != nil || !(f > 0) {
		return 0, fmt.Errorf("conditioning: scaling_factor %q", s)
	}
	return float32(f), nil
}
