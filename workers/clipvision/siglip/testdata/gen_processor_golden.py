"""Golden data for the SigLIP processor tests (processor_golden_test.go).

Run with the reference stack of the parity fixtures (torch 2.11, torchvision 0.26,
transformers 5.17, Pillow) from the repository root:

    python3 workers/clipvision/siglip/testdata/gen_processor_golden.py OUT_DIR

It writes OUT_DIR/processor_golden.safetensors and prints what transformers resolves
SiglipImageProcessor / AutoImageProcessor to. Inputs are a deterministic integer texture
(texture() below, mirrored in Go) so only outputs are stored: the resized uint8 image of the
torchvision backend (SiglipImageProcessor, transformers 5's default) and of the PIL backend
(SiglipImageProcessorPil, 56 px cases only), obtained with do_rescale=do_normalize=False; plus,
for the fixture configuration (56 px), the float32 pixel_values of both backends with rescale and
normalisation. Run on 2026-11-22: SiglipImageProcessor and AutoImageProcessor both resolved to
image_processing_siglip.SiglipImageProcessor with backend=torchvision (cpu capability AVX512), and
that processor reproduced the fixture's pixel_values exactly (rel_l2 0; the PIL one 1.9e-3 and
1.6e-3).
"""
import json
import sys

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image
from safetensors.numpy import save_file
from transformers import AutoImageProcessor, SiglipImageProcessor
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

FE = "testdata/parity/models/flux_redux_bfl/feature_extractor"


def texture(h, w, c):
    y, x, ch = np.meshgrid(np.arange(h), np.arange(w), np.arange(c), indexing="ij")
    v = (x * x * 3 + y * y * 5 + x * y * 7 + ch * 91 + (x ^ y) * 11 + (x // 3) * 40 + (y // 5) * 30) & 255
    return v.astype(np.uint8)


# name, height, width, input mode, output size
CASES = [
    ("bucket_544x704_to_384", 544, 704, "RGB", 384),
    ("up_17x5_to_384", 17, 5, "RGB", 384),
    # (no 1x1 case: transformers reads a (1, 1, 3) array as channels-first, a 1x3 one-channel image)
    ("mixed_200x1000_to_384", 200, 1000, "RGB", 384),
    ("fixture_48x64_to_56", 48, 64, "RGB", 56),
    ("fixture_120x90_to_56", 120, 90, "RGB", 56),
    ("gray_9x13_to_56", 9, 13, "L", 56),
    ("rgba_31x20_to_56", 31, 20, "RGBA", 56),
    ("same_56", 56, 56, "RGB", 56),
]


def main(out):
    tv = SiglipImageProcessor.from_pretrained(FE)
    auto = AutoImageProcessor.from_pretrained(FE)
    pil = SiglipImageProcessorPil.from_pretrained(FE)
    info = {
        "torch": torch.__version__, "torchvision": torchvision.__version__,
        "transformers": transformers.__version__, "pillow": PIL.__version__,
        "SiglipImageProcessor": f"{type(tv).__module__}.{type(tv).__name__} backend={getattr(tv, 'backend', '?')}",
        "AutoImageProcessor": f"{type(auto).__module__}.{type(auto).__name__} backend={getattr(auto, 'backend', '?')}",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    print(json.dumps(info, indent=1))
    tensors = {}
    for name, h, w, mode, size in CASES:
        chans = {"RGB": 3, "L": 1, "RGBA": 4}[mode]
        arr = texture(h, w, chans)
        img = Image.fromarray(arr[..., 0] if mode == "L" else arr, mode)
        # numpy input for RGB, as FramePack passes it; PIL input for the other modes
        src = arr if mode == "RGB" else img
        kw = dict(size={"height": size, "width": size}, return_tensors="pt")
        for tag, proc in (("torchvision", tv), ("pil", pil)):
            if tag == "pil" and size != 56:
                continue  # the Pillow resampler has its own golden data in internal/imageproc
            u8 = proc(images=src, do_rescale=False, do_normalize=False, **kw)["pixel_values"][0]
            u8 = u8.to(torch.float64).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
            tensors[f"{name}.{tag}.resized_hwc_u8"] = u8
            if size == 56:
                pv = proc(images=src, **kw)["pixel_values"][0].to(torch.float32).numpy()
                tensors[f"{name}.{tag}.pixel_values"] = np.ascontiguousarray(pv)
        if size == 56:
            a = tensors[f"{name}.torchvision.resized_hwc_u8"].astype(int)
            b = tensors[f"{name}.pil.resized_hwc_u8"].astype(int)
            print(f"{name}: torchvision vs pil: {int((a != b).sum())} of {a.size} differ, max {int(abs(a - b).max())}")
    # the fixture's own cases through the default processor: is it what made the fixture?
    from safetensors.numpy import load_file
    fx = load_file("testdata/parity/cases/siglip.safetensors")
    for i in range(2):
        img = fx[f"image_{i}.in.image_hwc_u8"]
        want = fx[f"image_{i}.out.pixel_values"]
        for tag, proc in (("torchvision", tv), ("pil", pil)):
            got = proc(images=img, return_tensors="pt")["pixel_values"].to(torch.float64).numpy()
            rel = np.linalg.norm(got - want) / np.linalg.norm(want)
            print(f"fixture image_{i} {tag}: rel_l2 {rel:.3g}, max {np.abs(got - want).max():.3g}")
    save_file(tensors, f"{out}/processor_golden.safetensors", metadata={k: str(v) for k, v in info.items()})


if __name__ == "__main__":
    main(sys.argv[1])
