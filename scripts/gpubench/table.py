#!/usr/bin/env python3
"""Joins torch.json and ours.json (from torch_bench.py and gpubench) into the README's table.

Usage: table.py DIR [JSON_OUT COMMIT]: with JSON_OUT, also writes the speed history record
docs/bench/<date>-<gpu>.json: {gpu, commit, date, rows: [{stage, ours_s, pytorch_s, ratio,
ours_peak_gib, pytorch_peak_gib}]}."""
import json
import os
import sys
import time

LABELS = {
    "transformer": "transformer forward (17,226 image + 857 cond tokens)",
    "vae_decode": "VAE decode, 18 latent frames (framewise, default)",
    "vae_decode_tiled": "VAE decode, 18 latent frames (framewise + spatial tiles)",
    "vae_encode": "VAE encode, 1 frame 544x704",
    "llama": "Llama 30 layers, 351 tokens",
    "clip": "CLIP-L text, 77 tokens",
    "siglip": "SigLIP so400m, 384²",
}


def gib(b):
    return f"{b / 2**30:.1f} GiB" if b else "–"


def main(d, json_out=None, commit=None):
    def load(name):
        try:
            with open(os.path.join(d, name)) as f:
                return json.load(f)
        except OSError:
            return {"stages": {}}
    torch, ours = load("torch.json"), load("ours.json")
    gpu = torch.get("gpu") or ours.get("device", "?")
    print(f"Measured {time.strftime('%Y-%m-%d')} on {gpu}, PyTorch {torch.get('torch', '?')}, random weights, same run.")
    print("Ours: cuda backend, weights and activations in FramePack's dtypes (transformer bf16, the rest fp16), f32")
    print("accumulation, attention the fused flash kernel (mma.sync). PyTorch: FramePack's dtypes")
    print("(transformer bf16, the rest fp16), SDPA attention. Time is the median of the timed runs after a warm-up.\n")
    rows = []
    print("| stage | ours | PyTorch | ours / PyTorch | peak ours | peak PyTorch |")
    print("|---|---|---|---|---|---|")
    for k, label in LABELS.items():
        o, t = ours["stages"].get(k, {}), torch["stages"].get(k, {})
        os_ = f"{o['seconds']:.3f} s" if "seconds" in o else ("error: " + o.get("error", "not run"))[:80]
        ts = f"{t['seconds']:.3f} s" if "seconds" in t else ("error: " + t.get("error", "not run"))[:80]
        ratio = f"{o['seconds'] / t['seconds']:.2f}x" if "seconds" in o and "seconds" in t else "–"
        print(f"| {label} | {os_} | {ts} | {ratio} | {gib(o.get('peak_bytes'))} | {gib(t.get('peak_bytes'))} |")
        if "seconds" in o or "seconds" in t:
            rows.append({
                "stage": k,
                "ours_s": o.get("seconds"),
                "pytorch_s": t.get("seconds"),
                "ratio": round(o["seconds"] / t["seconds"], 3) if "seconds" in o and "seconds" in t else None,
                "ours_peak_gib": round(o["peak_bytes"] / 2**30, 2) if o.get("peak_bytes") else None,
                "pytorch_peak_gib": round(t["peak_bytes"] / 2**30, 2) if t.get("peak_bytes") else None,
            })
    if json_out:
        rec = {"gpu": gpu, "commit": commit, "date": time.strftime("%Y-%m-%d"), "torch": torch.get("torch"),
               "rows": rows}
        with open(json_out, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:4])
