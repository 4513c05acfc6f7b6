#!/usr/bin/env python3
"""augment::decode_crop (torch.ops.ember.decode_crop) against torchvision.

Images made here with PIL in the formats datasets hold (JPEG 4:2:0, 4:4:4,
progressive, grayscale, CMYK; PNG RGB, RGBA, grayscale, palette) are decoded
and cropped by Ember and by torchvision (torchvision.io.decode_image in RGB
mode, then transforms.v2.functional.resized_crop with antialias, the op
torchvision's RandomResizedCrop runs on uint8 tensors).

1. Whole image at its own size, no DCT scaling: Ember's pixels are
   torchvision's, bitwise: both decode with libjpeg-turbo's ISLOW IDCT and
   fancy upsampling (exact integer arithmetic) or libpng, and nothing is
   resized. CMYK is checked separately: torchvision and Ember convert it
   with formulas of their own (C*K/255 on Adobe's inverted values; bound 1).
2. A crop resized to 224, no DCT scaling: Ember decodes only the crop's rows
   and iMCU columns, then runs the resize torchvision picks for the CPU's
   dispatch level on the same crop (ATen's uint8 kernel at AVX2 and AVX-512,
   float32 and rounding below: torchvision's _do_native_uint8_resize_on_cpu),
   so the result is torchvision's bitwise at every level, except where libjpeg's crop decoding
   changes the chroma upsampling at the crop's edge (4:2:0 only): at most a
   few pixel columns of the output may differ (counted below; bound: the
   output columns within one iMCU, 16 source pixels, of either edge).
3. With DCT scaling: the same crop from a 1/2, 1/4 or 1/8 decode differs from
   full decoding by what the smaller IDCT drops; reported (mean and max
   absolute difference), bounded loosely (mean <= 8 of 255), as it is a
   change of resampling, not an error.

    python3 tests/augment/decode_parity_test.py build/lib/libember.so
"""
import io
import sys

import numpy as np
import torch
from PIL import Image
import torchvision
from torchvision.transforms.v2 import functional as F


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove."""
    if not ok:
        raise AssertionError(what)


def photo(h, w, seed):
    """A smooth image with edges and noise, like a photo more than like noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.stack([128 + 100 * np.sin(x / (17 + seed) + y / 29), 128 + 90 * np.cos(y / (13 + seed)),
                    (x * 255 / w + y * 128 / h) % 256], axis=-1)
    img[h // 3: h // 2, w // 4: w // 2] = [250, 20, 20]
    img += rng.normal(0, 8, img.shape)
    return np.clip(img, 0, 255).astype(np.uint8)


def encoded():
    """(name, bytes) of every format."""
    out = []
    def jpeg(img, **kw):
        b = io.BytesIO()
        img.save(b, "JPEG", **kw)
        return b.getvalue()
    def png(img):
        b = io.BytesIO()
        img.save(b, "PNG")
        return b.getvalue()
    rgb = Image.fromarray(photo(333, 500, 1))
    out.append(("jpeg-420", jpeg(rgb, quality=90)))
    out.append(("jpeg-444", jpeg(Image.fromarray(photo(480, 640, 2)), quality=95, subsampling=0)))
    out.append(("jpeg-progressive", jpeg(Image.fromarray(photo(600, 451, 3)), quality=85, progressive=True)))
    out.append(("jpeg-gray", jpeg(Image.fromarray(photo(300, 200, 4)).convert("L"), quality=90)))
    out.append(("png-rgb", png(Image.fromarray(photo(257, 300, 5)))))
    rgba = Image.fromarray(photo(200, 260, 6)).convert("RGBA")
    rgba.putalpha(Image.fromarray((photo(200, 260, 7)[:, :, 0])))
    out.append(("png-rgba", png(rgba)))
    out.append(("png-gray", png(Image.fromarray(photo(240, 240, 8)).convert("L"))))
    out.append(("png-palette", png(Image.fromarray(photo(220, 300, 9)).convert("P"))))
    cmyk = ("jpeg-cmyk", jpeg(Image.fromarray(photo(256, 320, 10)).convert("CMYK"), quality=95))
    return out, cmyk


def tv_decode(data):
    return torchvision.io.decode_image(torch.frombuffer(bytearray(data), dtype=torch.uint8),
                                       mode=torchvision.io.ImageReadMode.RGB)  # [3, H, W]


def ember(data, box, size, dct=False):
    t = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return torch.ops.ember.decode_crop(t, list(box), list(size), False, False, dct).permute(2, 0, 1)  # [3, H, W]


def main():
    torch.ops.load_library(sys.argv[1])
    torch.set_num_threads(1)
    images, cmyk = encoded()
    for name, data in images:
        ref = tv_decode(data)
        h, w = ref.shape[1:]
        # top, left, height, width: inside the image
        crops = [(11, 7, min(150, h - 11), min(200, w - 7)), (0, 0, min(120, h), min(90, w)),
                 (40, 33, min(97, h - 40), min(211, w - 33))]
        got = ember(data, (0, 0, h, w), (h, w))
        check(got.shape == ref.shape, f"{name}: shape {tuple(got.shape)} vs {tuple(ref.shape)}")
        diff = (got.int() - ref.int()).abs()
        check(int(diff.max()) == 0, f"{name}: whole image differs from torchvision's decoding by up to {int(diff.max())}")
        for box in crops:
            t, l, ch, cw = box
            want = F.resized_crop(ref, t, l, ch, cw, [224, 224], antialias=True)
            got = ember(data, box, (224, 224))
            d = (got.int() - want.int()).abs()
            bad_cols = torch.nonzero(d.amax(dim=(0, 1))).flatten().tolist()
            # Output columns within 16 source pixels of the crop's left or right edge.
            edge = max(1, int(np.ceil(16 * 224 / cw)))
            check(all(c < edge or c >= 224 - edge for c in bad_cols),
                  f"{name} crop {box}: columns {bad_cols} differ from torchvision's, not only at the edges ({edge})")
            # To 40 x 40 every JPEG crop here is decoded at 4/8 in the DCT (its sides >= 8 * 40 / 4): the pixels
            # move, a little.
            scaled = ember(data, box, (40, 40), dct=True)
            full = ember(data, box, (40, 40), dct=False)
            s = (scaled.int() - full.int()).abs().float()
            if name.startswith("jpeg"):
                check(0 < float(s.mean()) <= 8, f"{name} crop {box}: DCT scaling moved pixels by "
                                                 f"{float(s.mean()):.2f} on average (0: it did not scale)")
            else:  # PNG has no DCT: the same pixels
                check(float(s.max()) == 0, f"{name} crop {box}: dct_scaling changed a PNG's pixels")
            print(f"[decode] {name} {h}x{w} crop {box}: {len(bad_cols)} edge columns differ from torchvision "
                  f"(max {int(d.max())}); DCT-scaled (4/8) to 40 vs full decoding: mean {float(s.mean()):.2f}, "
                  f"max {int(s.max())}")
        print(f"[decode] {name} {h}x{w}: whole image bitwise torchvision's")
    name, data = cmyk
    ref = tv_decode(data)
    h, w = ref.shape[1:]
    got = ember(data, (0, 0, h, w), (h, w))
    d = (got.int() - ref.int()).abs()
    # Both convert inverted CMYK as C*K/255 rounded one way or the other: at most 1 apart.
    check(int(d.max()) <= 1, f"{name}: {int(d.max())} away from torchvision's CMYK conversion")
    print(f"[decode] {name}: within {int(d.max())} of torchvision's CMYK conversion")
    # A crop outside the image is refused, not clamped (torchvision would pad it with zeros).
    try:
        ember(images[0][1], (300, 0, 100, 10), (8, 8))
        check(False, "a crop past the bottom accepted")
    except RuntimeError as e:
        check("lies outside the 333x500 image" in str(e), str(e))
    # Damaged input: an ember::Error, not a crash.
    # (A cut JPEG whose crop ends above the cut decodes: only the crop's rows are read.)
    for bad, needle in ((images[0][1][: len(images[0][1]) // 3], "truncated"), (images[0][1][:200], "libjpeg"),
                        (b"GIF89a" + bytes(100), "not JPEG or PNG")):
        try:
            ember(bad, (0, 0, 333, 500), (8, 8))
            check(False, f"{needle}: accepted")
        except RuntimeError as e:
            check(needle in str(e), f"{needle} not in {e}")
    print("[decode] passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
