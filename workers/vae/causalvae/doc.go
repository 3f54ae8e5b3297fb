// Package causalvae is HunyuanVideo's causal 3-D VAE (diffusers' AutoencoderKLHunyuanVideo at
// 58eb52c) on the native runtime: one Go type per reference module, bound at load to the
// checkpoint's tensors by their names (decoder.up_blocks.0.resnets.1.conv1.conv.weight), with
// diffusers' framewise and spatial tiling done on the host so the runtime holds one tile's
// activations at a time (batch samples run one after another, as use_slicing does), and
// FramePack's preview map (DecodeFake), which needs no runtime.
//
//	m, err := causalvae.Load(rt, dir, causalvae.Options{})
//	defer m.Close()
//	mean, logvar, err := m.Encode(ctx, pixels, causalvae.RunOptions{Tiling: causalvae.DefaultTiling()})
//	video, err := m.Decode(ctx, latents, causalvae.RunOptions{Tiling: causalvae.DefaultTiling()})
//
// Latents in and out are unscaled: FramePack multiplies the encoder's latent by
// Config.ScalingFactor and divides by it before decoding.
package causalvae
