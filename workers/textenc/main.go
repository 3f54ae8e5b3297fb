// Command textenc is the text-encoder worker: it loads HunyuanVideo's LLaMA (text_encoder/) and
// CLIP-L (text_encoder_2/) text encoders with their tokenizers from a snapshot folder and serves
// text_encode stages over the worker protocol (go-plugin, gRPC). The supervisor starts it, calls
// Load once and Run for the stage, then kills it.
package main

import "github.com/framepackd/framepackd/internal/workerkit"

func main() {
	workerkit.Main("textenc", func(k *workerkit.Kit) (workerkit.Worker, error) {
		return newWorker(k), nil
	})
}
