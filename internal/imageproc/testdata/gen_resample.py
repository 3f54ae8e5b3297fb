#!/usr/bin/python3
"""Writes resample_pillow.safetensors: Pillow's own LANCZOS/BICUBIC resize and FramePack-style
resize-and-center-crop outputs for small random and smooth images, the golden data of
TestResampleMatchesPillow. Needs Debian's python3-pil and python3-numpy (not needed by the tests).

Run from this folder: /usr/bin/python3 gen_resample.py
"""
import json
import struct

import numpy as np
from PIL import Image


def write_safetensors(path, tensors, meta):
    header, blobs, off = {}, [], 0
    for name, arr in tensors:
        arr = np.ascontiguousarray(arr, dtype=np.uint8)
        b = arr.tobytes()
        header[name] = {"dtype": "U8", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {"cases": json.dumps(meta), "pillow": Image.__version__}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def framepack_crop(image, tw, th):
    # resize_and_center_crop of FramePack's diffusers_helper/utils.py, restated.
    if th == image.shape[0] and tw == image.shape[1]:
        return image
    pil = Image.fromarray(image)
    w, h = pil.size
    s = max(tw / w, th / h)
    rw, rh = int(round(w * s)), int(round(h * s))
    r = pil.resize((rw, rh), Image.LANCZOS)
    return np.array(r.crop(((rw - tw) / 2, (rh - th) / 2, (rw + tw) / 2, (rh + th) / 2)))


rng = np.random.default_rng(20240601)


def noise(h, w):
    return rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def smooth(h, w):
    y, x = np.mgrid[0:h, 0:w]
    r = 127.5 + 127.5 * np.sin(x / 7.0 + y / 13.0)
    g = 255.0 * x / max(w - 1, 1)
    b = np.where((x // 5 + y // 5) % 2 == 0, 250, 5)
    return np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8)


filters = {"lanczos": Image.LANCZOS, "bicubic": Image.BICUBIC}
tensors, meta = [], []
resize_cases = [
    # (src h, w, out w, out h, box or None)
    (60, 80, 23, 17, None), (60, 80, 160, 120, None), (60, 80, 80, 33, None), (60, 80, 31, 60, None),
    (97, 131, 56, 56, None), (48, 64, 56, 56, None), (120, 90, 56, 56, None), (1, 1, 5, 3, None),
    (1, 7, 3, 4, None), (9, 1, 2, 5, None), (100, 75, 13, 100, None), (50, 50, 50, 50, (3.5, 2.25, 41.0, 47.75)),
    (64, 64, 17, 29, (10.0, 0.0, 60.5, 64.0)),
]
i = 0
for kind in ("noise", "smooth"):
    for (h, w, ow, oh, box) in resize_cases:
        for fname, f in filters.items():
            img = noise(h, w) if kind == "noise" else smooth(h, w)
            out = np.array(Image.fromarray(img).resize((ow, oh), f, box=box))
            tensors += [(f"r{i}.in", img), (f"r{i}.out", out)]
            meta.append({"key": f"r{i}", "op": "resize", "filter": fname, "width": ow, "height": oh, "box": box})
            i += 1
crop_cases = [(60, 80, 48, 32), (100, 50, 32, 48), (50, 60, 80, 80), (75, 101, 33, 21), (90, 90, 45, 31),
              (61, 47, 47, 30), (33, 200, 64, 64), (150, 40, 32, 96), (64, 96, 96, 64)]
for (h, w, tw, th) in crop_cases:
    for kind in ("noise", "smooth"):
        img = noise(h, w) if kind == "noise" else smooth(h, w)
        out = framepack_crop(img, tw, th)
        tensors += [(f"c{i}.in", img), (f"c{i}.out", out)]
        meta.append({"key": f"c{i}", "op": "resize_and_center_crop", "target_width": tw, "target_height": th})
        i += 1
write_safetensors("resample_pillow.safetensors", tensors, meta)
print(len(meta), "cases")
