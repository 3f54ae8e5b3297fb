// Package dit is FramePack's packed HunyuanVideo transformer (diffusers_helper
// HunyuanVideoTransformer3DModelPacked) on the native runtime, one Go type per reference module
// with the checkpoint's names:
//
//	x_embedder              HunyuanVideoPatchEmbed (Conv3d 1×p×p)
//	clean_x_embedder        HunyuanVideoPatchEmbedForCleanLatents (1x, 2x, 4x context)
//	context_embedder        HunyuanVideoTokenRefiner (text refiner)
//	time_text_embed         CombinedTimestepGuidanceTextProjEmbeddings
//	image_projection        ClipVisionProjection (SigLIP → model width)
//	rope                    HunyuanVideoRotaryPosEmbed (t, y, x with frame indices)
//	transformer_blocks.N    HunyuanVideoTransformerBlock (double stream)
//	single_transformer_blocks.N HunyuanVideoSingleTransformerBlock
//	norm_out, proj_out      AdaLayerNormContinuous, Linear
//
// A forward packs the image stream as [4x | 2x | 1x | noisy] tokens and the encoder stream as
// [SigLIP | text], the text cropped to its mask (batch 1, as the reference does). Everything a
// section's forwards share is embedded once by Model.Prepare into a Section; Model.Forward then
// runs one evaluation, with FramePack's TeaCache optionally skipping the blocks.
//
// Activations are float32 on every backend; the weight matrices stay in LoadOptions.WeightDType
// (f32, fp16, bf16 or the checkpoint's own), norms and biases in float32. Checkpoints in bf16,
// fp16 or f32 load exactly.
package dit
