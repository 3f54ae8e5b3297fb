// Command clipvision is the SigLIP image-encoder worker: it loads FLUX Redux's SigLIP vision
// model (image_encoder/) and its SiglipImageProcessor (feature_extractor/), then runs one
// image_encode stage: a uint8 image in shared memory through the processor and the model to
// last_hidden_state in shared memory. The supervisor kills it after the stage.
package main

import "github.com/framepackd/framepackd/internal/workerkit"

func main() {
	workerkit.Main("clipvision", func(k *workerkit.Kit) (workerkit.Worker, error) {
		return newWorker(k), nil
	})
}
