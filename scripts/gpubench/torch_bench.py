#!/usr/bin/env python3
"""PyTorch side of the full-size speed table (scripts/gpu-check.sh runs it on the GPU machine).

Writes, for every model, the full-size config.json (the fixture's config with the real sizes) and a
manifest of its tensors (names, shapes) that the Go side (scripts/gpubench) serves random weights
from, then times each stage with the reference code on the same GPU: FramePack's packed
transformer (diffusers_helper) and diffusers' AutoencoderKLHunyuanVideo (both from
third_party_ref/, brought by the script, never committed), transformers' LlamaModel, CLIPTextModel
and SiglipVisionModel. Dtypes are FramePack's: transformer bf16, the others fp16. Random weights,
real shapes (544x704, window 9, 18 latent frames, 351 and 77 tokens, 384² pixels).

Usage: torch_bench.py --out DIR [--manifests-only] [--stages a,b,c]
"""
import argparse
import json
import os
import statistics
import sys
import time
import traceback

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "third_party_ref"))
FIXTURES = os.path.join(ROOT, "testdata", "parity", "models")

# fixture folder and the real model's sizes (ARCHITECTURE.md §8)
MODELS = {
    "transformer": ("framepack_i2v", {
        "attention_head_dim": 128, "num_attention_heads": 24, "num_layers": 20, "num_single_layers": 40,
        "num_refiner_layers": 2, "image_proj_dim": 1152, "pooled_projection_dim": 768,
        "rope_axes_dim": [16, 56, 56], "text_embed_dim": 4096}),
    "vae": ("hunyuanvideo/vae", {"block_out_channels": [128, 256, 512, 512]}),
    "llama": ("hunyuanvideo/text_encoder", {
        "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
        "head_dim": 128, "num_hidden_layers": 32, "vocab_size": 128320, "max_position_embeddings": 8192}),
    "clip": ("hunyuanvideo/text_encoder_2", {
        "hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12, "num_hidden_layers": 12,
        "projection_dim": 768, "vocab_size": 49408}),
    "siglip": ("flux_redux_bfl/image_encoder", {
        "hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16, "num_hidden_layers": 27,
        "image_size": 384}),
}

# FramePack's section at the 640 bucket: 544x704 → latents 68x88, window 9, 18 latent frames decoded
H, W, WINDOW, DECODE_FRAMES, LLAMA_TOKENS, LLAMA_LAYERS, TEXT_TOKENS = 68, 88, 9, 18, 351, 30, 128


def full_config(name):
    folder, over = MODELS[name]
    with open(os.path.join(FIXTURES, folder, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(over)
    return cfg


def build(name, cfg):
    import torch
    if name == "transformer":
        from diffusers_helper.models.hunyuan_video_packed import HunyuanVideoTransformer3DModelPacked
        m = HunyuanVideoTransformer3DModelPacked.from_config(cfg)
        m.initialize_teacache(enable_teacache=False)
        m.high_quality_fp32_output_for_inference = True
        return m
    if name == "vae":
        from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import AutoencoderKLHunyuanVideo
        return AutoencoderKLHunyuanVideo.from_config(cfg)
    import transformers
    if name == "llama":
        return transformers.LlamaModel(transformers.LlamaConfig.from_dict(cfg))
    if name == "clip":
        return transformers.CLIPTextModel(transformers.CLIPTextConfig.from_dict(cfg))
    if name == "siglip":
        return transformers.SiglipVisionModel(transformers.SiglipVisionConfig.from_dict(cfg))
    raise ValueError(name)


def write_manifests(out):
    import torch
    for name in MODELS:
        d = os.path.join(out, name)
        os.makedirs(d, exist_ok=True)
        cfg = full_config(name)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f, indent=1)
        with torch.device("meta"):
            m = build(name, cfg)
        tensors = {}
        for k, v in m.state_dict().items():
            tensors[k] = {"shape": list(v.shape), "dtype": str(v.dtype).replace("torch.", "")}
        with open(os.path.join(d, "manifest.json"), "w") as f:
            json.dump({"model": name, "tensors": tensors}, f)
        print(f"manifest {name}: {len(tensors)} tensors, {sum(_numel(t['shape']) for t in tensors.values())/1e9:.3f} B elements",
              flush=True)


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def on_gpu(name, cfg, dtype):
    """The model built directly on the GPU in dtype, with its own random init."""
    import torch
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device("cuda"):
            m = build(name, cfg)
    finally:
        torch.set_default_dtype(old)
    return m.to(dtype).eval().requires_grad_(False)


def timed(fn, warm, reps):
    import torch
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts), ts


def stage(name):
    """Returns (model name, dtype, warm, reps, make(model) -> callable)."""
    import torch
    dev = "cuda"
    if name == "transformer":
        def make(m):
            bf = torch.bfloat16
            g = torch.Generator(device=dev).manual_seed(0)
            r = lambda *s: torch.randn(*s, generator=g, device=dev, dtype=bf)
            mask = torch.zeros(1, 512, dtype=torch.int64, device=dev)
            mask[:, :TEXT_TOKENS] = 1
            kw = dict(
                hidden_states=r(1, 16, WINDOW, H, W), timestep=torch.tensor([875.0], device=dev, dtype=bf),
                encoder_hidden_states=r(1, 512, 4096), encoder_attention_mask=mask, pooled_projections=r(1, 768),
                guidance=torch.tensor([10000.0], device=dev, dtype=bf),
                latent_indices=torch.arange(1, WINDOW + 1, device=dev)[None],
                clean_latents=r(1, 16, 2, H, W), clean_latent_indices=torch.tensor([[0, WINDOW + 1]], device=dev),
                clean_latents_2x=r(1, 16, 2, H, W),
                clean_latent_2x_indices=torch.arange(WINDOW + 2, WINDOW + 4, device=dev)[None],
                clean_latents_4x=r(1, 16, 16, H, W),
                clean_latent_4x_indices=torch.arange(WINDOW + 4, WINDOW + 20, device=dev)[None],
                image_embeddings=r(1, 729, 1152), return_dict=False)
            return lambda: m(**kw)
        return "transformer", torch.bfloat16, 1, 3, make
    if name in ("vae_decode", "vae_decode_tiled"):
        def make(m):
            if name == "vae_decode_tiled":
                m.enable_tiling()
            z = torch.randn(1, 16, DECODE_FRAMES, H, W, device=dev, dtype=torch.float16)
            return lambda: m.decode(z).sample
        return "vae", torch.float16, 1, 1, make
    if name == "vae_encode":
        def make(m):
            x = torch.randn(1, 3, 1, H * 8, W * 8, device=dev, dtype=torch.float16)
            return lambda: m.encode(x).latent_dist.mode()
        return "vae", torch.float16, 1, 3, make
    if name == "llama":
        def make(m):
            ids = torch.randint(0, 128000, (1, LLAMA_TOKENS), device=dev)
            mask = torch.ones(1, LLAMA_TOKENS, dtype=torch.int64, device=dev)
            return lambda: m(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states[-1]
        return "llama", torch.float16, 1, 3, make
    if name == "clip":
        def make(m):
            ids = torch.randint(0, 49407, (1, 77), device=dev)
            return lambda: m(input_ids=ids).pooler_output
        return "clip", torch.float16, 1, 5, make
    if name == "siglip":
        def make(m):
            px = torch.randn(1, 3, 384, 384, device=dev, dtype=torch.float16)
            return lambda: m(pixel_values=px).last_hidden_state
        return "siglip", torch.float16, 1, 5, make
    raise ValueError(name)


STAGES = ["transformer", "vae_decode", "vae_decode_tiled", "vae_encode", "llama", "clip", "siglip"]


def run_stages(out, names):
    import torch
    results = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0), "stages": {}}
    for name in names:
        res = {}
        try:
            model, dtype, warm, reps, make = stage(name)
            cfg = full_config(model)
            if model == "llama":
                cfg["num_hidden_layers"] = LLAMA_LAYERS  # hidden_states[-3] of 32: 30 layers run
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            m = on_gpu(model, cfg, dtype)
            torch.cuda.synchronize()
            load = time.perf_counter() - t0
            with torch.inference_mode():
                med, ts = timed(make(m), warm, reps)
            res = {"seconds": med, "runs": ts, "peak_bytes": torch.cuda.max_memory_allocated(), "dtype": str(dtype).replace("torch.", ""),
                   "build_seconds": load}
            del m
        except Exception as e:  # one stage's failure is reported in the table, not fatal
            res = {"error": f"{type(e).__name__}: {e}"}
            traceback.print_exc()
        torch.cuda.empty_cache()
        results["stages"][name] = res
        print(f"torch {name}: {json.dumps(res)}", flush=True)
        with open(os.path.join(out, "torch.json"), "w") as f:
            json.dump(results, f, indent=1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--manifests-only", action="store_true")
    ap.add_argument("--stages", default=",".join(STAGES))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    write_manifests(a.out)
    if not a.manifests_only:
        run_stages(a.out, [s for s in a.stages.split(",") if s])


if __name__ == "__main__":
    main()
