#!/usr/bin/env python3
"""Joins torch.json and ours.json (from torch_bench.py and gpubench) into the README's table.

Usage: table.py DIR [JSON_OUT COMMIT]: with JSON_OUT, also writes the speed history record
docs/bench/<date>-<gpu>.json: {gpu, commit, date, rows: [{stage, ours_s, pytorch_s, ratio,
ours_peak_gib, pytorch_peak_gib}]}."""
import json
import os
import sys
import time

# Our stages measured against another PyTorch stage (the same work).
TORCH_KEY = {"vae_decode_tiled256": "vae_decode_tiled"}

LABELS = {
    "transformer": "transformer forward (17,226 image + 857 cond tokens)",
    "vae_decode": "VAE decode, 18 latent frames (framewise, default)",
    "vae_decode_tiled": "VAE decode, 18 latent frames, tiled (ours: tiling chosen at an 8 GiB cap)",
    "vae_decode_tiled256": "VAE decode, 18 latent frames, 256 px tiles (both sides)",
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
        o, t = ours["stages"].get(k, {}), torch["stages"].get(TORCH_KEY.get(k, k), {})
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
    conv_table(ours)
    for row in rows:
        o = ours["stages"].get(row["stage"], {})
        if o.get("tiling"):
            row["ours_tiling"] = o["tiling"]
        c = o.get("conv")
        if c:
            row["ours_conv_served"] = c.get("served_by_tier")
            row["ours_conv_first_run_s"] = round(c.get("first_run_seconds", 0), 3)
    if json_out:
        rec = {"gpu": gpu, "commit": commit, "date": time.strftime("%Y-%m-%d"), "torch": torch.get("torch"),
               "rows": rows}
        with open(json_out, "w") as f:
            json.dump(rec, f, indent=1)
            f.write("\n")


def conv_table(ours):
    """Per stage: the VAE tiling, which conv tier served how many convs and shapes, and the
    shapes' first (synchronised) runs, which hold cuDNN's FindEx / MIOpen's Find."""
    stages = [(k, v) for k, v in ours["stages"].items() if v.get("conv") or v.get("tiling")]
    if not stages:
        return
    print("\nConv chain per stage (ours): tier that served the convs, and the first run of each shape")
    print("(synchronised; for vendor_tuned it includes the vendor's Find), paid once by the warm-up run.\n")
    print("| stage | tiling | convs | shapes | served by | first runs | slowest first run |")
    print("|---|---|---|---|---|---|---|")
    for k, o in stages:
        c = o.get("conv") or {}
        shapes = c.get("shapes") or []
        served = ", ".join(f"{t} {n}" for t, n in sorted((c.get("served_by_tier") or {}).items())) or "–"
        slow = f"{shapes[0]['first_ms']:.1f} ms ({shapes[0]['tier']})" if shapes else "–"
        first = f"{c['first_run_seconds']:.2f} s" if "first_run_seconds" in c else "–"
        print(f"| {k} | {o.get('tiling', '–')} | {c.get('convs', 0)} | {len(shapes)} | {served} | {first} | {slow} |")


if __name__ == "__main__":
    main(sys.argv[1], *sys.argv[2:4])
