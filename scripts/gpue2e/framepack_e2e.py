#!/usr/bin/env python3
"""FramePack's side of the end-to-end benchmark (make gpu-e2e, issues 17 and 30).

Runs FramePack's own image-to-video worker loop (lllyasviel/FramePack demo_gradio.py `worker`,
written out headless: no gradio, no stream queue; the per-step preview is made; the MP4 that
demo_gradio.py writes after every section only with --write-video) on the checkpoints mkmodels
wrote (--models ROOT: hunyuanvideo-community/HunyuanVideo, lllyasviel/flux_redux_bfl,
lllyasviel/FramePackI2V_HY), with demo_gradio.py's model setup and memory handling verbatim:

* high-VRAM mode: every model moved to the GPU once (`high_vram = free_mem_gb > 60`);
* low-VRAM mode: DynamicSwapInstaller on the transformer and the text encoder, VAE slicing and
  tiling, `load_model_as_complete` / `unload_complete_models` around each stage, and
  `move_model_to_device_with_memory_preservation(transformer, gpu, gpu_memory_preservation)`
  before each section (6 GB, the UI's default).

The card size is simulated as in the issue: a blocker tensor allocated first leaves only
--budget GiB free (0: none). Same job as ours: 544x704 (the input image's size, bucket 640),
window 9, --steps, 4 s (3 sections, FramePack's own section arithmetic), cfg 1, gs 10, TeaCache
off, seed 31337.

Each run (one mode, one budget) is a process of its own and adds its rows to --out (a JSON file
that keeps earlier rows: resumable; a job row's "wrote_video" says whether it includes writing
the video).
Rows: {mode, budget_gb, stage, seconds, peak_gib, nvml_peak_gib, load_s, load_gbps,
host_rss_peak_gib, host_used_peak_gib}; stage "section" is the transformer's sampling plus the
VAE decode with the moves around them, as demo_gradio.py runs a section; "job" is the job from
the text encoder to the last section, the models already in host memory ("load" is their load
from disk and, in high-VRAM mode, to the GPU). peak_gib is torch.cuda.max_memory_allocated less
the blocker; nvml_peak_gib the device's used memory (cudaMemGetInfo, sampled every 50 ms) less
the blocker and what was in use before; host_rss_peak_gib this process's RSS and
host_used_peak_gib the system's used memory (MemTotal - MemAvailable) above its reading when
the process started, both sampled every 50 ms, within the stage (the job row: over the whole
run, the load included: FramePack holds every model in host memory).

  framepack_e2e.py --third-party DIR --models ROOT --out framepack.json --mode low --budget 6
"""
import argparse
import json
import os
import sys
import threading
import time
import traceback
import types


def host_used():
    """MemTotal - MemAvailable in bytes (page cache the kernel can drop counts as free)."""
    f = {}
    with open("/proc/meminfo") as fh:
        for line in fh:
            k, v = line.split(":", 1)
            f[k] = int(v.split()[0]) * 1024
    return f["MemTotal"] - f["MemAvailable"]


def self_rss():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


HOST_BASE = host_used()  # before torch is imported: all of this process's memory counts


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--third-party", required=True, help="folder holding diffusers/ and diffusers_helper/")
    p.add_argument("--models", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--mode", choices=["high", "low"], required=True)
    p.add_argument("--budget", type=float, default=0, help="GiB left free by a blocker allocation (0: no blocker)")
    p.add_argument("--preserve", type=float, default=6, help="gpu_memory_preservation (low-VRAM mode)")
    p.add_argument("--width", type=int, default=704)
    p.add_argument("--height", type=int, default=544)
    p.add_argument("--window", type=int, default=9)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--seconds", type=float, default=4)
    p.add_argument("--write-video", default="", help="folder: write the video so far after every section as demo_gradio.py does (save_bcthw_as_mp4; a 'write_video' row each)")
    p.add_argument("--beside", default="", help="what ran beside this run on the machine (kept in every row)")
    p.add_argument("--skip-done", action="store_true", help="do nothing when --out already has this run's job row without error")
    return p.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.third_party)
try:
    import cv2  # noqa: F401  (diffusers_helper.utils imports it; nothing here uses it)
except ImportError:
    sys.modules["cv2"] = types.ModuleType("cv2")

import einops  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

GIB = 1 << 30
ROWS = []
WROTE = [True]  # False once writing the video failed (--write-video)
MODE = "high_vram" if ARGS.mode == "high" else "low_vram"


class Sampler:
    """The device's used memory (cudaMemGetInfo), this process's RSS and the system's used memory,
    sampled every 50 ms on a thread: peaks since the last reset, and since the start."""

    def __init__(self):
        free, total = torch.cuda.mem_get_info()
        self.base, self.peak, self.run = total - free, total - free, True
        self.rss = self.rss_all = self_rss()
        self.used = self.used_all = host_used()
        self.t = threading.Thread(target=self.loop, daemon=True)
        self.t.start()

    def loop(self):
        while self.run:
            free, total = torch.cuda.mem_get_info()
            self.peak = max(self.peak, total - free)
            self.host()
            time.sleep(0.05)

    def host(self):
        r, u = self_rss(), host_used()
        self.rss, self.used = max(self.rss, r), max(self.used, u)
        self.rss_all, self.used_all = max(self.rss_all, r), max(self.used_all, u)

    def reset(self):
        free, total = torch.cuda.mem_get_info()
        self.peak = total - free
        self.rss, self.used = self_rss(), host_used()

    def stop(self):
        self.run = False
        self.t.join()


def keep_hidden_states(llama):
    """Makes output_hidden_states=True give hidden_states on transformers versions whose LlamaModel
    returns None there when loaded with from_pretrained (5.17 on the GPU machine): the decoder
    layers' inputs and outputs are recorded by hooks, and the tuple is built as transformers
    documents it (the embeddings, every layer's output, the last one after the final norm).
    FramePack reads hidden_states[-3]; nothing else changes."""
    orig = llama.forward

    def forward(*args, **kwargs):
        if not kwargs.get("output_hidden_states"):
            return orig(*args, **kwargs)
        seen = []

        def pre(_m, a, kw):
            if not seen:
                seen.append(a[0] if a else kw["hidden_states"])

        def post(_m, _a, out):
            seen.append(out[0] if isinstance(out, tuple) else out)

        hooks = [llama.layers[0].register_forward_pre_hook(pre, with_kwargs=True)]
        hooks += [layer.register_forward_hook(post) for layer in llama.layers]
        try:
            out = orig(*args, **kwargs)
        finally:
            for h in hooks:
                h.remove()
        if getattr(out, "hidden_states", None) is None:
            out.hidden_states = tuple(seen[:-1]) + (out.last_hidden_state,)
        return out

    llama.forward = forward


def save():
    old = []
    if os.path.exists(ARGS.out):
        with open(ARGS.out) as f:
            old = [r for r in json.load(f).get("rows", []) if not (r["mode"] == MODE and r["budget_gb"] == ARGS.budget)]
    with open(ARGS.out + ".tmp", "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": old + ROWS}, f, indent=1)
    os.replace(ARGS.out + ".tmp", ARGS.out)


def main():
    torch.set_grad_enabled(False)
    blocker = None
    blocker_bytes = 0
    if ARGS.budget > 0:
        free, _ = torch.cuda.mem_get_info()
        blocker_bytes = max(0, free - int(ARGS.budget * GIB))
        blocker = torch.empty(blocker_bytes, dtype=torch.uint8, device="cuda")
    smi = Sampler()

    def row(stage, seconds, load_s=0.0, load_bytes=0, error=""):
        torch.cuda.synchronize()
        smi.host()
        r = {"mode": MODE, "budget_gb": ARGS.budget, "stage": stage, "seconds": seconds,
             "peak_gib": (torch.cuda.max_memory_allocated() - blocker_bytes) / GIB,
             "nvml_peak_gib": (smi.peak - smi.base) / GIB, "load_s": load_s,
             "load_gbps": load_bytes / 1e9 / load_s if load_s > 0 else 0.0,
             "host_rss_peak_gib": smi.rss / GIB, "host_used_peak_gib": max(0, smi.used - HOST_BASE) / GIB}
        if ARGS.beside:
            r["beside"] = ARGS.beside
        if error:
            r["error"] = error
        ROWS.append(r)
        print("framepack", json.dumps(r), flush=True)
        save()

    from diffusers import AutoencoderKLHunyuanVideo
    from transformers import CLIPTextModel, CLIPTokenizer, LlamaModel, SiglipImageProcessor, SiglipVisionModel
    try:
        from transformers import LlamaTokenizerFast
    except ImportError:  # transformers 5 has one tokenizer class per model
        from transformers import AutoTokenizer as LlamaTokenizerFast
    from diffusers_helper.bucket_tools import find_nearest_bucket
    from diffusers_helper.clip_vision import hf_clip_vision_encode
    from diffusers_helper.hunyuan import encode_prompt_conds, vae_decode, vae_decode_fake, vae_encode
    from diffusers_helper.memory import (DynamicSwapInstaller, fake_diffusers_current_device, gpu, load_model_as_complete,
                                         move_model_to_device_with_memory_preservation,
                                         offload_model_from_device_for_memory_preservation, unload_complete_models)
    from diffusers_helper.models.hunyuan_video_packed import HunyuanVideoTransformer3DModelPacked
    from diffusers_helper.pipelines.k_diffusion_hunyuan import sample_hunyuan
    from diffusers_helper.utils import crop_or_pad_yield_mask, resize_and_center_crop, save_bcthw_as_mp4, soft_append_bcthw

    high_vram = ARGS.mode == "high"
    hv = os.path.join(ARGS.models, "hunyuanvideo-community", "HunyuanVideo")
    fr = os.path.join(ARGS.models, "lllyasviel", "flux_redux_bfl")
    fp = os.path.join(ARGS.models, "lllyasviel", "FramePackI2V_HY")

    # ---- demo_gradio.py's model setup (transformers 5 spells torch_dtype dtype) -----------------
    t0 = time.perf_counter()
    text_encoder = LlamaModel.from_pretrained(hv, subfolder='text_encoder', dtype=torch.float16).cpu()
    text_encoder_2 = CLIPTextModel.from_pretrained(hv, subfolder='text_encoder_2', dtype=torch.float16).cpu()
    tokenizer = LlamaTokenizerFast.from_pretrained(hv, subfolder='tokenizer')
    tokenizer_2 = CLIPTokenizer.from_pretrained(hv, subfolder='tokenizer_2')
    vae = AutoencoderKLHunyuanVideo.from_pretrained(hv, subfolder='vae', torch_dtype=torch.float16).cpu()
    feature_extractor = SiglipImageProcessor.from_pretrained(fr, subfolder='feature_extractor')
    image_encoder = SiglipVisionModel.from_pretrained(fr, subfolder='image_encoder', dtype=torch.float16).cpu()
    transformer = HunyuanVideoTransformer3DModelPacked.from_pretrained(fp, torch_dtype=torch.bfloat16).cpu()
    keep_hidden_states(text_encoder)
    models = [text_encoder, text_encoder_2, vae, image_encoder, transformer]
    for m in models:
        m.eval()
    if not high_vram:
        vae.enable_slicing()
        vae.enable_tiling()
    transformer.high_quality_fp32_output_for_inference = True
    transformer.to(dtype=torch.bfloat16)
    vae.to(dtype=torch.float16)
    image_encoder.to(dtype=torch.float16)
    text_encoder.to(dtype=torch.float16)
    text_encoder_2.to(dtype=torch.float16)
    for m in models:
        m.requires_grad_(False)
    nbytes = sum(p.numel() * p.element_size() for m in models for p in m.parameters())
    load_disk = time.perf_counter() - t0
    t1 = time.perf_counter()
    if not high_vram:
        DynamicSwapInstaller.install_model(transformer, device=gpu)
        DynamicSwapInstaller.install_model(text_encoder, device=gpu)
    else:
        text_encoder.to(gpu)
        text_encoder_2.to(gpu)
        image_encoder.to(gpu)
        vae.to(gpu)
        transformer.to(gpu)
    torch.cuda.synchronize()
    load_dev = time.perf_counter() - t1
    row("load", load_disk + load_dev, load_s=load_disk + load_dev, load_bytes=nbytes)

    # ---- demo_gradio.py's worker ----------------------------------------------------------
    prompt, n_prompt, seed, cfg, gs, rs = "The girl dances gracefully, with clear movements, full of charm.", "", 31337, 1.0, 10.0, 0.0
    window, steps = ARGS.window, ARGS.steps
    total_latent_sections = int(max(round((ARGS.seconds * 30) / (window * 4)), 1))
    yy, xx = np.mgrid[0:ARGS.height, 0:ARGS.width]
    input_image = np.stack([255 * xx // ARGS.width, 255 * yy // ARGS.height, (xx ^ yy) & 255], axis=-1).astype(np.uint8)
    job_t0 = time.perf_counter()

    def stage(name, fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        smi.reset()
        s0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        row(name, time.perf_counter() - s0)
        return out

    if not high_vram:
        unload_complete_models(text_encoder, text_encoder_2, image_encoder, vae, transformer)

    def text():
        if not high_vram:
            fake_diffusers_current_device(text_encoder, gpu)
            load_model_as_complete(text_encoder_2, target_device=gpu)
        llama_vec, clip_l_pooler = encode_prompt_conds(prompt, text_encoder, text_encoder_2, tokenizer, tokenizer_2)
        if cfg == 1:
            llama_vec_n, clip_l_pooler_n = torch.zeros_like(llama_vec), torch.zeros_like(clip_l_pooler)
        else:
            llama_vec_n, clip_l_pooler_n = encode_prompt_conds(n_prompt, text_encoder, text_encoder_2, tokenizer, tokenizer_2)
        llama_vec, llama_attention_mask = crop_or_pad_yield_mask(llama_vec, length=512)
        llama_vec_n, llama_attention_mask_n = crop_or_pad_yield_mask(llama_vec_n, length=512)
        return llama_vec, llama_attention_mask, clip_l_pooler, llama_vec_n, llama_attention_mask_n, clip_l_pooler_n

    llama_vec, llama_attention_mask, clip_l_pooler, llama_vec_n, llama_attention_mask_n, clip_l_pooler_n = stage("text_encode", text)

    H, W, C = input_image.shape
    height, width = find_nearest_bucket(H, W, resolution=640)
    input_image_np = resize_and_center_crop(input_image, target_width=width, target_height=height)
    input_image_pt = (torch.from_numpy(input_image_np).float() / 127.5 - 1).permute(2, 0, 1)[None, :, None]

    def vae_enc():
        if not high_vram:
            load_model_as_complete(vae, target_device=gpu)
        return vae_encode(input_image_pt, vae)

    start_latent = stage("vae_encode", vae_enc)

    def clip_vision():
        if not high_vram:
            load_model_as_complete(image_encoder, target_device=gpu)
        return hf_clip_vision_encode(input_image_np, feature_extractor, image_encoder).last_hidden_state

    image_encoder_last_hidden_state = stage("image_encode", clip_vision)
    llama_vec = llama_vec.to(transformer.dtype)
    llama_vec_n = llama_vec_n.to(transformer.dtype)
    clip_l_pooler = clip_l_pooler.to(transformer.dtype)
    clip_l_pooler_n = clip_l_pooler_n.to(transformer.dtype)
    image_encoder_last_hidden_state = image_encoder_last_hidden_state.to(transformer.dtype)

    rnd = torch.Generator("cpu").manual_seed(seed)
    num_frames = window * 4 - 3
    history_latents = torch.zeros(size=(1, 16, 1 + 2 + 16, height // 8, width // 8), dtype=torch.float32).cpu()
    history_pixels = None
    total_generated_latent_frames = 0
    latent_paddings = list(reversed(range(total_latent_sections)))
    if total_latent_sections > 4:
        latent_paddings = [3] + [2] * (total_latent_sections - 3) + [1, 0]
    for latent_padding in latent_paddings:
        is_last_section = latent_padding == 0
        latent_padding_size = latent_padding * window
        indices = torch.arange(0, sum([1, latent_padding_size, window, 1, 2, 16])).unsqueeze(0)
        (clean_latent_indices_pre, blank_indices, latent_indices, clean_latent_indices_post, clean_latent_2x_indices,
         clean_latent_4x_indices) = indices.split([1, latent_padding_size, window, 1, 2, 16], dim=1)
        clean_latent_indices = torch.cat([clean_latent_indices_pre, clean_latent_indices_post], dim=1)
        clean_latents_pre = start_latent.to(history_latents)
        clean_latents_post, clean_latents_2x, clean_latents_4x = history_latents[:, :, :1 + 2 + 16, :, :].split([1, 2, 16], dim=2)
        clean_latents = torch.cat([clean_latents_pre, clean_latents_post], dim=2)
        sec_t0 = time.perf_counter()

        def callback(d):  # demo_gradio.py's per-step preview, less the queue it is pushed to
            preview = vae_decode_fake(d['denoised'])
            preview = (preview * 255.0).detach().cpu().numpy().clip(0, 255).astype(np.uint8)
            return einops.rearrange(preview, 'b c t h w -> (b h) (t w) c')

        def sample():
            if not high_vram:
                unload_complete_models()
                move_model_to_device_with_memory_preservation(transformer, target_device=gpu, preserved_memory_gb=ARGS.preserve)
            transformer.initialize_teacache(enable_teacache=False)
            return sample_hunyuan(
                transformer=transformer, sampler='unipc', width=width, height=height, frames=num_frames,
                real_guidance_scale=cfg, distilled_guidance_scale=gs, guidance_rescale=rs, num_inference_steps=steps,
                generator=rnd, prompt_embeds=llama_vec, prompt_embeds_mask=llama_attention_mask, prompt_poolers=clip_l_pooler,
                negative_prompt_embeds=llama_vec_n, negative_prompt_embeds_mask=llama_attention_mask_n,
                negative_prompt_poolers=clip_l_pooler_n, device=gpu, dtype=torch.bfloat16,
                image_embeddings=image_encoder_last_hidden_state, latent_indices=latent_indices, clean_latents=clean_latents,
                clean_latent_indices=clean_latent_indices, clean_latents_2x=clean_latents_2x,
                clean_latent_2x_indices=clean_latent_2x_indices, clean_latents_4x=clean_latents_4x,
                clean_latent_4x_indices=clean_latent_4x_indices, callback=callback)

        generated_latents = stage("transformer", sample)
        if is_last_section:
            generated_latents = torch.cat([start_latent.to(generated_latents), generated_latents], dim=2)
        total_generated_latent_frames += int(generated_latents.shape[2])
        history_latents = torch.cat([generated_latents.to(history_latents), history_latents], dim=2)

        def decode():
            if not high_vram:
                offload_model_from_device_for_memory_preservation(transformer, target_device=gpu, preserved_memory_gb=8)
                load_model_as_complete(vae, target_device=gpu)
            real_history_latents = history_latents[:, :, :total_generated_latent_frames, :, :]
            if history_pixels is None:
                return vae_decode(real_history_latents, vae).cpu()
            section_latent_frames = (window * 2 + 1) if is_last_section else (window * 2)
            current_pixels = vae_decode(real_history_latents[:, :, :section_latent_frames], vae).cpu()
            return soft_append_bcthw(current_pixels, history_pixels, window * 4 - 3)

        history_pixels = stage("vae_decode", decode)
        if not high_vram:
            unload_complete_models()
        sec = time.perf_counter() - sec_t0
        if ARGS.write_video and WROTE[0]:
            # demo_gradio.py: the whole video so far, every section (torchvision.io.write_video)
            name = os.path.join(ARGS.write_video, f"{MODE}-{ARGS.budget:g}-{total_generated_latent_frames}.mp4")
            w0 = time.perf_counter()
            try:
                os.makedirs(ARGS.write_video, exist_ok=True)
                save_bcthw_as_mp4(history_pixels, name, fps=30, crf=16)
                row("write_video", time.perf_counter() - w0)
            except Exception as e:  # no PyAV or no encoder: the job rows then hold no video writing
                WROTE[0] = False
                row("write_video", 0.0, error=f"{type(e).__name__}: {e}"[:300])
        peaks = [r for r in ROWS if r["stage"] in ("transformer", "vae_decode")][-2:]
        ROWS.append({"mode": MODE, "budget_gb": ARGS.budget, "stage": "section", "seconds": sec,
                     "peak_gib": max(r["peak_gib"] for r in peaks), "nvml_peak_gib": max(r["nvml_peak_gib"] for r in peaks),
                     "load_s": 0.0, "load_gbps": 0.0, "host_rss_peak_gib": max(r["host_rss_peak_gib"] for r in peaks),
                     "host_used_peak_gib": max(r["host_used_peak_gib"] for r in peaks)})
        if is_last_section:
            break
    smi.host()
    ROWS.append({"mode": MODE, "budget_gb": ARGS.budget, "stage": "job", "seconds": time.perf_counter() - job_t0,
                 "peak_gib": max(r["peak_gib"] for r in ROWS), "nvml_peak_gib": max(r["nvml_peak_gib"] for r in ROWS),
                 "load_s": load_disk + load_dev, "load_gbps": 0.0, "host_rss_peak_gib": smi.rss_all / GIB,
                 "host_used_peak_gib": max(0, smi.used_all - HOST_BASE) / GIB, "wrote_video": bool(ARGS.write_video) and WROTE[0],
                 "beside": ARGS.beside})
    print("framepack", json.dumps(ROWS[-1]), flush=True)
    save()
    smi.stop()
    del blocker


def done():
    if not os.path.exists(ARGS.out):
        return False
    with open(ARGS.out) as f:
        rows = json.load(f).get("rows", [])
    return any(r["mode"] == MODE and r["budget_gb"] == ARGS.budget and r["stage"] == "job" and not r.get("error") for r in rows)


if __name__ == "__main__":
    if ARGS.skip_done and done():
        print(f"framepack {MODE} budget {ARGS.budget}: kept ({ARGS.out})")
        sys.exit(0)
    try:
        main()
    except Exception as e:  # recorded as a row: the table says which mode failed and why
        traceback.print_exc()
        ROWS.append({"mode": MODE, "budget_gb": ARGS.budget, "stage": "job", "seconds": 0.0, "peak_gib": 0.0,
                     "nvml_peak_gib": 0.0, "load_s": 0.0, "load_gbps": 0.0, "error": f"{type(e).__name__}: {e}"[:500]})
        save()
        print("framepack", json.dumps(ROWS[-1]), flush=True)
        sys.exit(1)
