// Command vae is the VAE worker: it loads HunyuanVideo's causal 3-D VAE
// (AutoencoderKLHunyuanVideo: config.json + diffusion_pytorch_model.safetensors) and serves
// vae_encode and vae_decode stages over the worker protocol (go-plugin, gRPC), with tensors in
// shared memory. The supervisor starts it, calls Load once and Run for the stage, then kills it.
//
// Encode: pixels [B, 3, T, H, W] in [-1, 1] → the posterior mean, written as the latents
// tensor, and its log-variance (clamped to [-30, 20]) as "<latents name>.logvar" in the same
// file, both [B, 16, (T−1)/4+1, H/8, W/8] and unscaled: the caller multiplies by the config's
// scaling_factor. Decode: latents already divided by scaling_factor → pixels
// [B, 3, 4T−3, 8h, 8w]. Tiling follows diffusers: framewise chunks always (16 frames, stride
// 12), spatial tiles when the request enables them (default 256 px, stride 192).
package main

import "github.com/framepackd/framepackd/internal/workerkit"

func main() {
	workerkit.Main("vae", func(k *workerkit.Kit) (workerkit.Worker, error) {
		return newWorker(k), nil
	})
}
