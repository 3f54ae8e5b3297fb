#!/usr/bin/env python3
"""Reference fixture for fp8 weights beyond testdata/parity's fp8 set (cases/fp8_reference).

FramePack's packed transformer (lllyasviel/FramePack 97fe5db diffusers_helper
HunyuanVideoTransformer3DModelPacked) on the tiny models of testdata/parity/models, forward in
float64 on CPU with its weights made as framepackd's rules say (docs/DECISIONS.md "fp8 weights",
internal/fp8's package doc), the inputs of testdata/parity/cases/fp8.json's first case:

* quantize_fp8: the bf16 checkpoint quantized at load (LoadRequest.weights "fp8"): every Linear
  weight (every 2-D *.weight) to float8_e4m3fn with one scale per output channel, computed in
  float32 as the runtime does:  s = max(max|w[o]| / 448, 1e-8),  q = e4m3(clamp(w / s, ±448)),
  then w = q·s in float64.
* quantize_fp8_lora: the same with models/loras/style_peft.safetensors (strength 1) merged
  before quantizing (the LoRA's B @ A in float32, added in float64 and rounded to float32, as
  lora.Merged does), then quantized.
* comfy_lora: models/fp8/fp8_comfy_scaled.safetensors with models/loras/motion_musubi.safetensors
  (strength 0.8): every weight the LoRA changes is dequantized exactly (q·s), merged, and
  requantized by the quantize_fp8 rule; the others stay q·s.
* act_tensor, act_token: models/fp8/fp8_musubi_channel.safetensors (w = q·s[o]) with fp8
  activations (LoadRequest.fp8_compute "tensor" / "token"): the input of every Linear whose weight
  is 8-bit is replaced by q(x / s_x)·s_x, s_x = max|x| / 448 over the whole input or per token
  (1 for zeros), q = e4m3(clamp(·, ±448)), in float64.

Outputs are float32 (computed in float64). Tolerances: 1e-3 for the weight cases (as the fp8
fixture); 5e-3 for the activation cases, whose quantization boundaries the float32 and float64
computations of s_x can land on differently.

Usage (on a machine with torch >= 2.1, diffusers, safetensors):
  python3 gen_fp8.py --third-party DIR_WITH_diffusers_AND_diffusers_helper \\
      [--models testdata/parity/models] [--out testdata/reference/cases]
then run `go test ./workers/transformer/ -run TestParityFP8Reference` (it skips until the
fixture exists) and commit cases/fp8_reference.{json,safetensors} with this script's log.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--third-party", required=True, help="folder holding diffusers/ and diffusers_helper/")
    p.add_argument("--models", default=os.path.join(ROOT, "testdata", "parity", "models"))
    p.add_argument("--parity", default=os.path.join(ROOT, "testdata", "parity", "cases"))
    p.add_argument("--out", default=os.path.join(HERE, "cases"))
    return p.parse_args()


ARGS = parse_args()
sys.path.insert(0, ARGS.third_party)

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

torch.set_grad_enabled(False)
from diffusers_helper.models.hunyuan_video_packed import HunyuanVideoTransformer3DModelPacked  # noqa: E402

F64 = torch.float64
E4M3 = torch.float8_e4m3fn
MODELS_REL = "../parity/models"  # the models folder as the fixture names it (relative to testdata/reference)


def quantize_rows(w):
    """framepackd's quantize-at-load rule, in float32 as the runtime computes it: returns q·s in float64."""
    w = w.to(torch.float32)
    s = torch.clamp(w.abs().amax(dim=1, keepdim=True) / 448.0, min=1e-8)
    q = (w / s).clamp(-448.0, 448.0).to(E4M3)
    return q.to(F64) * s.to(F64)


def dequantize(sd, name):
    """A tensor of an fp8 file as its format says (internal/fp8): q, q·s, or musubi's q·s[o][i/bs]·t."""
    w = sd[name]
    mod = name[: -len(".weight")] if name.endswith(".weight") else name
    q = w.to(F64)
    s = sd.get(mod + ".scale_weight")
    if s is None:
        return q
    s = s.to(F64)
    if s.ndim == 3:  # block-wise [out, nb, 1]
        out, nb, _ = s.shape
        q = q.reshape(out, nb, -1) * s
        t = sd.get(mod + ".scale_weight_tensor")
        if t is not None:
            q = q * t.to(F64)
        return q.reshape(w.shape)
    if s.numel() == 1:
        return q * s.reshape(())
    return q * s  # [out, 1]


def lora_deltas(path, strength, module_names):
    """module → ΔW (float32 B@A times strength·scale) for a PEFT or musubi/kohya LoRA file."""
    sd = load_file(path)
    under = {m.replace(".", "_"): m for m in module_names}
    out = {}
    for k in sd:
        if k.endswith(".lora_A.weight"):  # PEFT: transformer.<module>.lora_A/B, scale 1
            mod = k[: -len(".lora_A.weight")].removeprefix("transformer.")
            a, b = sd[k].float(), sd[k.replace("lora_A", "lora_B")].float()
            out[mod] = (b @ a, strength)
        elif k.endswith(".lora_down.weight"):  # musubi/kohya: lora_unet_<module with _>, alpha/rank
            base = k[: -len(".lora_down.weight")]
            mod = under[base.removeprefix("lora_unet_")]
            a, b = sd[k].float(), sd[base + ".lora_up.weight"].float()
            alpha = sd.get(base + ".alpha")
            scale = (float(alpha) / a.shape[0]) if alpha is not None else 1.0
            out[mod] = (b @ a, strength * scale)
    return out


def merge(w32, delta):
    """lora.Merged's arithmetic: w (float32) + coeff·(B@A) in float64, rounded to float32."""
    d, coeff = delta
    return (w32.to(F64) + coeff * d.to(F64)).to(torch.float32)


class ActQuant:
    """Replaces the input of the patched Linears by its e4m3 quantization (per tensor or token)."""

    def __init__(self, per_token):
        self.per_token = per_token

    def __call__(self, module, args):
        x = args[0]
        if self.per_token:
            m = x.abs().amax(dim=-1, keepdim=True)
        else:
            m = x.abs().amax()
        s = torch.where(m > 0, m / 448.0, torch.ones_like(m))
        q = (x / s).clamp(-448.0, 448.0).to(E4M3).to(x.dtype)
        return (q * s,) + tuple(args[1:])


def load_model():
    m = HunyuanVideoTransformer3DModelPacked.from_pretrained(os.path.join(ARGS.models, "framepack_i2v"), torch_dtype=F64).eval()
    m.initialize_teacache(enable_teacache=False)
    return m


def set_weights(model, weights):
    sd = model.state_dict()
    for k, v in weights.items():
        sd[k] = v.to(F64)
    model.load_state_dict(sd)


def forward(model, inputs):
    return model(**inputs, return_dict=False)[0].float()


def main():
    with open(os.path.join(ARGS.parity, "fp8.json")) as f:
        fx = json.load(f)
    case0 = fx["cases"][0]
    ts = load_file(os.path.join(ARGS.parity, fx["tensors"]))
    inputs = {}
    for name, key in case0["inputs"].items():
        v = ts[key]
        inputs[name] = v.to(F64) if v.is_floating_point() else v
    base_sd = load_file(os.path.join(ARGS.models, "framepack_i2v", "diffusion_pytorch_model.safetensors"))
    linears = [k for k, v in base_sd.items() if v.ndim == 2 and k.endswith(".weight")]
    modules = [k[: -len(".weight")] for k in linears]

    cases, tensors = [], {}

    def add(name, weights, note, tol, params, hooks=None):
        model = load_model()
        set_weights(model, weights)
        handles = []
        if hooks:
            for mod_name, hook in hooks:
                handles.append(model.get_submodule(mod_name).register_forward_pre_hook(hook))
        out = forward(model, inputs)
        for h in handles:
            h.remove()
        c = {"name": name, "op": "transformer.forward_weights", "inputs": {}, "outputs": {"sample": name + ".out.sample"},
             "params": dict(params, config=MODELS_REL + "/framepack_i2v/config.json", latent_padding=case0["params"]["latent_padding"],
                            latent_window_size=case0["params"]["latent_window_size"], batch_size=1),
             "tolerance": {"rel_l2": tol}, "note": note}
        for iname, key in case0["inputs"].items():
            k = name + ".in." + iname
            tensors[k] = ts[key].contiguous()
            c["inputs"][iname] = k
        tensors[name + ".out.sample"] = out.contiguous()
        cases.append(c)
        print(f"{name}: |out| {out.norm():.4g}", flush=True)

    base_weights = {k: base_sd[k].to(torch.float32) for k in linears}
    add("quantize_fp8", {k: quantize_rows(w) for k, w in base_weights.items()},
        "every Linear quantized at load: s = max(max|w|/448, 1e-8) per output channel in float32, w = e4m3(clamp(w/s)) * s",
        1e-3, {"weights": MODELS_REL + "/framepack_i2v/diffusion_pytorch_model.safetensors", "quantize": "fp8"})

    peft = os.path.join(ARGS.models, "loras", "style_peft.safetensors")
    deltas = lora_deltas(peft, 1.0, modules)
    merged = {k: (merge(w, deltas[k[: -len(".weight")]]) if k[: -len(".weight")] in deltas else w) for k, w in base_weights.items()}
    add("quantize_fp8_lora", {k: quantize_rows(w) for k, w in merged.items()},
        "style_peft merged into the bf16 weights (float32 delta, float64 add, float32 result), then quantized at load",
        1e-3, {"weights": MODELS_REL + "/framepack_i2v/diffusion_pytorch_model.safetensors", "quantize": "fp8",
               "loras": [{"path": MODELS_REL + "/loras/style_peft.safetensors", "strength": 1.0}]})

    comfy_path = os.path.join(ARGS.models, "fp8", "fp8_comfy_scaled.safetensors")
    comfy = load_file(comfy_path)
    musubi_lora = os.path.join(ARGS.models, "loras", "motion_musubi.safetensors")
    deltas = lora_deltas(musubi_lora, 0.8, modules)
    w = {}
    for k in linears:
        mod = k[: -len(".weight")]
        if k in comfy and comfy[k].dtype in (torch.float8_e4m3fn, torch.float8_e5m2):
            deq = dequantize(comfy, k)
            w[k] = quantize_rows(merge(deq.to(torch.float32), deltas[mod])) if mod in deltas else deq
        else:
            v = comfy[k].to(torch.float32)
            w[k] = merge(v, deltas[mod]).to(F64) if mod in deltas else v.to(F64)
    add("comfy_lora", w, "ComfyUI scaled fp8 with motion_musubi at 0.8: changed weights dequantized (q*s), merged, requantized per channel",
        1e-3, {"weights": MODELS_REL + "/fp8/fp8_comfy_scaled.safetensors",
               "loras": [{"path": MODELS_REL + "/loras/motion_musubi.safetensors", "strength": 0.8}]})

    musubi_path = os.path.join(ARGS.models, "fp8", "fp8_musubi_channel.safetensors")
    musubi = load_file(musubi_path)
    w = {k: dequantize(musubi, k) for k in linears}
    fp8_mods = [k[: -len(".weight")] for k in linears if musubi[k].dtype in (torch.float8_e4m3fn, torch.float8_e5m2)]
    for mode in ("tensor", "token"):
        hook = ActQuant(per_token=mode == "token")
        add("act_" + mode, w, f"musubi per-channel fp8 weights, every 8-bit Linear's input quantized to e4m3 per {mode}",
            5e-3, {"weights": MODELS_REL + "/fp8/fp8_musubi_channel.safetensors", "fp8_compute": mode},
            hooks=[(m, hook) for m in fp8_mods])

    os.makedirs(ARGS.out, exist_ok=True)
    save_file(tensors, os.path.join(ARGS.out, "fp8_reference.safetensors"))
    fx_out = {"fixture": "fp8_reference", "reference": dict(fx["reference"], generator="testdata/reference/gen_fp8.py"),
              "models": {"transformer": MODELS_REL + "/framepack_i2v", "root": MODELS_REL},
              "tensors": "fp8_reference.safetensors", "cases": cases}
    with open(os.path.join(ARGS.out, "fp8_reference.json"), "w") as f:
        json.dump(fx_out, f, indent=1)
    print(f"wrote {ARGS.out}/fp8_reference.{{json,safetensors}}", flush=True)


if __name__ == "__main__":
    main()
