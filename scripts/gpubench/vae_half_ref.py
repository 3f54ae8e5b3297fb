#!/usr/bin/env python3
"""How close the reference VAE itself comes to the fixtures in 16 bits (issue 18's 2e-2 bar).

Runs diffusers' AutoencoderKLHunyuanVideo (third_party_ref/, the fixtures' commit) on the GPU with
the fixture's tiny VAE (testdata/parity/models/hunyuanvideo/vae) in fp16 and in bf16, weights and
activations alike, as FramePack runs it in fp16, on every encode and decode case of
testdata/parity/cases/vae.json (the preview map, decode_fake, has no convs and is left out), and
prints each output's relative L2 error against the fixture's output (computed in float64, stored
as f32): the error the
reference code has in that dtype, to set beside ours (scripts/gpu-check.sh vaehalf).

Usage: vae_half_ref.py [--out results.json]
"""
import argparse
import json
import os
import struct
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "third_party_ref"))
PARITY = os.path.join(ROOT, "testdata", "parity")

DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64", "U8": "uint8"}


def load_safetensors(path, torch):
    """The tensors of a safetensors file (read here: the header is JSON, the data little-endian)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        dt = getattr(torch, DTYPES[info["dtype"]])
        buf = bytearray(data[a:b])
        t = torch.frombuffer(buf, dtype=dt) if buf else torch.empty(0, dtype=dt)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def rel_l2(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    return float((got - want).norm() / want.norm())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    args = ap.parse_args()
    import torch
    from diffusers.models.autoencoders.autoencoder_kl_hunyuan_video import AutoencoderKLHunyuanVideo

    cases = json.load(open(os.path.join(PARITY, "cases", "vae.json")))
    tensors = load_safetensors(os.path.join(PARITY, "cases", cases["tensors"]), torch)
    vdir = os.path.join(PARITY, cases["models"]["vae"])
    cfg = json.load(open(os.path.join(vdir, "config.json")))
    weights = load_safetensors(os.path.join(vdir, "diffusion_pytorch_model.safetensors"), torch)
    results = []
    for dname in ("float16", "bfloat16"):
        dt = getattr(torch, dname)
        for c in cases["cases"]:
            if c["op"] not in ("vae.encode", "vae.decode"):
                continue
            vae = AutoencoderKLHunyuanVideo.from_config(cfg)
            missing, unexpected = vae.load_state_dict(weights, strict=False)
            if missing or unexpected:
                raise SystemExit(f"vae weights: missing {missing[:3]}, unexpected {unexpected[:3]}")
            vae = vae.to("cuda", dt).eval()
            params = c.get("params") or {}
            for k, v in params.items():
                if not hasattr(vae, k):
                    raise SystemExit(f"case {c['name']}: the VAE has no attribute {k} (a param the fixture sets)")
                setattr(vae, k, v)
            if any(k.endswith(("_height", "_width")) for k in params):
                vae.use_tiling = True
            with torch.no_grad():
                if c["op"] == "vae.encode":
                    x = tensors[c["inputs"]["x"]].to("cuda", dt)
                    dist = vae.encode(x).latent_dist
                    got = {"mean": dist.mean, "logvar": dist.logvar}
                else:
                    z = tensors[c["inputs"]["z"]].to("cuda", dt)
                    got = {"sample": vae.decode(z).sample}
            for name, key in c["outputs"].items():
                e = rel_l2(got[name].float(), tensors[key])
                results.append({"dtype": dname, "case": c["name"], "output": name, "rel_l2": e,
                                "tolerance": 2e-2})
                print(f"reference {dname} case {c['name']} {name}: rel_l2={e:.3g}", flush=True)
    if args.out:
        json.dump(results, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
