// Command transformer is the transformer worker: it loads FramePack's packed HunyuanVideo
// transformer (config.json + diffusion_pytorch_model safetensors, sharded or not) and serves
// transformer_section stages over the worker protocol (go-plugin, gRPC): one section sampled
// with UniPC from the noise it draws with the job's carried torch generator, one progress event
// and one denoised preview per step, the latents and the generator's new state as the result.
// The supervisor starts it, calls Load once and Run for the stage, then kills it.
package main

import "github.com/framepackd/framepackd/internal/workerkit"

func main() {
	workerkit.Main("transformer", func(k *workerkit.Kit) (workerkit.Worker, error) {
		return newWorker(k), nil
	})
}
