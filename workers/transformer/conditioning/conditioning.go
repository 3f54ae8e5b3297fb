// Package conditioning is what FramePack's transformer is conditioned on besides the noisy
// latents, the timestep and the guidance: the one host-memory form the transformer worker reads
// from shared memory, the sampler passes through and the model (dit) embeds.
package conditioning

// Tensor is a float tensor in host memory, row-major.
type Tensor struct {
	Shape []int
	Data  []float32
}

// IntTensor is an integer tensor in host memory (token masks, frame indices), row-major.
type IntTensor struct {
	Shape []int
	Data  []int64
}

// Set reports whether the tensor is given (an optional input left out has no shape and no data).
func (t Tensor) Set() bool { return len(t.Shape) > 0 || len(t.Data) > 0 }

// Set reports whether the tensor is given.
func (t IntTensor) Set() bool { return len(t.Shape) > 0 || len(t.Data) > 0 }

// Conditioning is one branch (positive or negative prompt): the keyword arguments FramePack's
// sample_hunyuan passes to HunyuanVideoTransformer3DModelPacked.forward. Only batch 1 is
// supported by the model.
//
// In FramePack both branches share the image embeddings and the clean latents; only the text
// (LLaMA states, mask, CLIP pooled) differs, so a negative branch can reuse the positive one's
// slices. The sampler never reads the tensors; the model decides what it requires.
type Conditioning struct {
	EncoderHiddenStates  Tensor    // LLaMA hidden_states[-3] cropped at 95, padded: [1, L, text_embed_dim]
	EncoderAttentionMask IntTensor // 1 for real text tokens: [1, L]
	PooledProjections    Tensor    // CLIP-L pooled output: [1, pooled_projection_dim]
	ImageEmbeddings      Tensor    // SigLIP last_hidden_state: [1, Li, image_proj_dim] (with has_image_proj)

	LatentIndices        IntTensor // frame indices of the noisy latents: [1, T]; empty means 0..T-1
	CleanLatents         Tensor    // start latent and newest history latent: [1, 16, T1, H, W] (optional)
	CleanLatentIndices   IntTensor // [1, T1], with CleanLatents
	CleanLatents2x       Tensor    // [1, 16, T2, H, W] (optional)
	CleanLatent2xIndices IntTensor // [1, T2], with CleanLatents2x
	CleanLatents4x       Tensor    // [1, 16, T4, H, W] (optional)
	CleanLatent4xIndices IntTensor // [1, T4], with CleanLatents4x
}
