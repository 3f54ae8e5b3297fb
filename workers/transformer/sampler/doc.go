// Package sampler is FramePack's sampling loop for one section, written against a Model
// interface that the transformer worker implements on the native runtime.
//
// It follows the reference (lllyasviel/FramePack, diffusers_helper) step for step, in float32 as
// the reference keeps its latents:
//   - pipelines/k_diffusion_hunyuan.py sample_hunyuan: the latent shape, the flow-shift schedule
//     (mu linear in the sequence length, capped at ln 7, or ln(shift)), sigmas from
//     linspace(1, 0, steps+1) through the flux time shift (Sigmas, FluxMu, ShiftMu);
//   - k_diffusion/wrapper.py fm_wrapper: the model's inputs cast to the model dtype (bf16 in the
//     reference app: the timestep σ·1000 and the distilled guidance gs·1000 are rounded to bf16,
//     10000 → 9984, and so is x), real classifier-free guidance with a separate negative pass and
//     the std rescale, x0 = x − σ·v (FlowMatchDenoiser);
//   - k_diffusion/uni_pc_fm.py: Lvmin Zhang's flow-matching UniPC, bh1 or bh2, order
//     min(3, steps−1) with lower orders for the first steps, predictor and corrector with the
//     reference's small float32 linear solves; the section's result is the last data prediction
//     (UniPC).
//
// Sample runs a whole section; the noise comes from the caller (internal/torchrng reproduces the
// reference's seeded torch.randn), so one generator can be carried across a job's sections.
package sampler
