#!/usr/bin/python3
"""Writes the decode test images of decode/ that Pillow (or a raw PNG writer) can make, then
records how Pillow reads every file in decode/ — Image.open, ImageOps.exif_transpose,
convert("RGB") — into decode_pillow.safetensors, the golden data of TestDecodeMatchesPillow.
Needs Debian's python3-pil and python3-numpy (not needed by the tests). Run after
`IMAGEPROC_WRITE_TESTDATA=1 go test -run TestWriteGoTestdata` (which writes decode/go_*.png).

Run from this folder: /usr/bin/python3 gen_decode.py
"""
import io
import json
import os
import struct
import zlib

import numpy as np
from PIL import Image, ImageOps

D = "decode"
os.makedirs(D, exist_ok=True)
rng = np.random.default_rng(7)


def pattern(h, w):
    y, x = np.mgrid[0:h, 0:w]
    r = 127.5 + 120 * np.sin(x / 3.0 + y / 5.0)
    g = np.where(x < w // 2, 30, 220) + 0 * y
    b = np.where((x // 4 + y // 4) % 2 == 0, 240, 20)
    return np.stack([r, g, b], -1).clip(0, 255).astype(np.uint8)


def exif_with_orientation(o):
    e = Image.Exif()
    e[0x0112] = o
    return e.tobytes()


def chunk(typ, data):
    return struct.pack(">I", len(data)) + typ + data + struct.pack(">I", zlib.crc32(typ + data) & 0xFFFFFFFF)


def raw_png(path, w, h, depth, ctype, rows, extra=()):
    """rows: list of bytes per scanline (already packed)."""
    ihdr = struct.pack(">IIBBBBB", w, h, depth, ctype, 0, 0, 0)
    raw = b"".join(b"\x00" + r for r in rows)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
    for typ, body in extra:
        data += chunk(typ, body)
    data += chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    with open(path, "wb") as f:
        f.write(data)


img = pattern(23, 37)
pil = Image.fromarray(img)
# JPEG: three subsamplings, odd size; grayscale; CMYK (Adobe, inverted as libjpeg writes it).
for name, ss in (("420", 2), ("422", 1), ("444", 0)):
    pil.save(f"{D}/jpeg_{name}.jpg", quality=95, subsampling=ss)
Image.fromarray(pattern(24, 38)).save(f"{D}/jpeg_420_even.jpg", quality=95, subsampling=2)
pil.convert("L").save(f"{D}/jpeg_gray.jpg", quality=95)
cmyk = Image.fromarray(np.concatenate([img, (np.arange(23 * 37).reshape(23, 37, 1) % 97).astype(np.uint8)], -1), "CMYK")
cmyk.save(f"{D}/jpeg_cmyk.jpg", quality=95)
Image.fromarray(pattern(1, 1)).save(f"{D}/jpeg_1x1.jpg", quality=95)
pil.save(f"{D}/jpeg_progressive.jpg", quality=90, progressive=True)
for o in (3, 6, 8):
    pil.save(f"{D}/jpeg_orient{o}.jpg", quality=95, subsampling=0, exif=exif_with_orientation(o))

# WebP: lossy odd and even sizes, lossy with alpha, lossless, orientation.
pil.save(f"{D}/webp_lossy_odd.webp", quality=80)
Image.fromarray(pattern(24, 38)).save(f"{D}/webp_lossy_even.webp", quality=80)
rgba = np.concatenate([img, (np.arange(23 * 37).reshape(23, 37, 1) % 256).astype(np.uint8)], -1)
Image.fromarray(rgba, "RGBA").save(f"{D}/webp_alpha.webp", quality=80)
pil.save(f"{D}/webp_lossless.webp", lossless=True)
Image.fromarray(pattern(1, 1)).save(f"{D}/webp_1x1.webp", quality=80)
pil.save(f"{D}/webp_orient6.webp", quality=80, exif=exif_with_orientation(6))

# PNG: orientations through eXIf, palette with transparency, 1-bit, RGBA, LA, 16-bit gray.
small = Image.fromarray(pattern(5, 7))
for o in range(1, 9):
    small.save(f"{D}/png_orient{o}.png", exif=exif_with_orientation(o))
small.quantize(16).save(f"{D}/png_palette.png", transparency=3)
Image.fromarray(pattern(9, 13)).convert("1").save(f"{D}/png_1bit.png")
Image.fromarray(rgba, "RGBA").save(f"{D}/png_rgba.png")
Image.fromarray(rgba[..., 1:3].copy(), "LA").save(f"{D}/png_la.png")
Image.fromarray((np.arange(9 * 13).reshape(9, 13) * 577 % 65536).astype(np.uint16), "I;16").save(f"{D}/png_i16.png")
Image.fromarray(pattern(1, 1)).save(f"{D}/png_1x1.png")

# Raw PNGs for colour types Pillow does not write: 16-bit gray+alpha (type 4), 16-bit gray with
# tRNS, 2-bit gray, 4-bit palette with tRNS.
w, h = 11, 6
la16 = [b"".join(struct.pack(">HH", (x * 6007 + y * 911) % 65536, x * 6000) for x in range(w)) for y in range(h)]
raw_png(f"{D}/raw_la16.png", w, h, 16, 4, la16)
g16 = [b"".join(struct.pack(">H", (x * 6007 + y * 911) % 65536 if x % 3 else x * y) for x in range(w)) for y in range(h)]
raw_png(f"{D}/raw_gray16_trns.png", w, h, 16, 0, g16, [(b"tRNS", struct.pack(">H", 6007))])
g2 = []
for y in range(h):
    vals = [(x + y) % 4 for x in range(12)]
    g2.append(bytes((vals[i] << 6) | (vals[i + 1] << 4) | (vals[i + 2] << 2) | vals[i + 3] for i in range(0, 12, 4))[:3])
raw_png(f"{D}/raw_gray2.png", w, h, 2, 0, g2)
pal = bytes(v for i in range(16) for v in (i * 16, 255 - i * 16, (i * 77) % 256))
p4 = [bytes(((((x + y) % 16) << 4) | ((x + 1 + y) % 16)) for x in range(0, 12, 2)) for y in range(h)]
raw_png(f"{D}/raw_palette4_trns.png", w, h, 4, 3, p4, [(b"PLTE", pal), (b"tRNS", bytes([0, 128, 255, 7]))])

# What Pillow makes of every file.
tensors, names = [], []
for name in sorted(os.listdir(D)):
    im = Image.open(os.path.join(D, name))
    im = ImageOps.exif_transpose(im)
    arr = np.ascontiguousarray(np.array(im.convert("RGB")), dtype=np.uint8)
    tensors.append((name, arr))
    names.append(name)

header, blobs, off = {}, [], 0
for name, arr in tensors:
    b = arr.tobytes()
    header[name] = {"dtype": "U8", "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
    blobs.append(b)
    off += len(b)
header["__metadata__"] = {"files": json.dumps(names), "pillow": Image.__version__}
hb = json.dumps(header).encode()
hb += b" " * ((8 - len(hb) % 8) % 8)
with open("decode_pillow.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(hb)) + hb + b"".join(blobs))
print(len(names), "files")
