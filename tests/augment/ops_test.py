"""Ember's augmentation kernels as PyTorch operators, from Python.

Usage: python ops_test.py /path/to/libember.so [--cpu | --cuda]

Loads the library with torch.ops.load_library and checks, against formulas
written here in PyTorch: flips and normalisation, the random resized crop
(interpolate of the drawn box), brightness and grayscale, erasing,
determinism across batch splits, argument errors (--cpu: these only), and
that the dispatcher's CUDA kernel equals the CPU result (--cuda: this only;
exit 77, skipped, without a CUDA device). Without either flag, both; the
CUDA case is then skipped without a device.
"""
import math
import sys
import unittest

from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerance import EPS32  # noqa: E402

MODE = next((m for m in ("--cpu", "--cuda") if m in sys.argv), None)
if MODE:
    sys.argv.remove(MODE)
LIB = sys.argv.pop(1) if len(sys.argv) > 1 else None

X0, Y0, W, H, HFLIP, VFLIP, BRIGHT, CONTRAST, SAT, HUE, GRAY, EX0, EY0, EW, EH = range(15)


def sample(idx, h, w, size=(), crop="none", padding=0, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip=0.0,
           vflip=0.0, color=(0.0, 0.0, 0.0, 0.0), color_p=1.0, gray=0.0, erase=0.0, seed=0, epoch=0):
    return torch.ops.ember.augment_sample_params(idx, h, w, list(size), crop, padding, list(scale), list(ratio),
                                                 hflip, vflip, list(color), color_p, gray, erase, [0.02, 0.33],
                                                 [0.3, 3.3], seed, epoch)


def apply(x, p, size, mean=(), std=(), dtype=torch.float32, channels_last=False, erase_value=0.0):
    return torch.ops.ember.augment_apply(x, p, list(size), list(mean), list(std), 0.5, erase_value, dtype,
                                         channels_last)


def as_float(x):  # uint8 NHWC -> float NCHW in [0, 1]
    return x.permute(0, 3, 1, 2).float() / 255.0


class WithLibrary(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        torch.ops.load_library(LIB)
        g = torch.Generator().manual_seed(0)
        cls.x = torch.randint(0, 256, (8, 20, 24, 3), dtype=torch.uint8, generator=g)


class AugmentOps(WithLibrary):
    def test_schema_is_registered(self):
        self.assertTrue(hasattr(torch.ops.ember, "augment_apply"))
        self.assertIn("augment_apply", str(torch.ops.ember.augment_apply.default._schema))

    def test_flip_and_normalise(self):
        idx = torch.arange(8)
        p = sample(idx, 20, 24, hflip=1.0)
        self.assertTrue(bool((p[:, HFLIP] == 1).all()))
        mean, std = (0.5, 0.4, 0.3), (0.2, 0.25, 0.3)
        out = apply(self.x, p, (20, 24), mean, std)
        ref = (as_float(self.x).flip(3) - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        # Float32 roundings (u = eps32 / 2), each side against the exact value: Ember v = x * fl(1/255) (2u |v|),
        # (v - mean) (u |v - mean|), * fl(1/std) (2u |out|); here x / 255 (u |v|), - mean, / std (u |out|).
        # Together 3u |v| / std + 5u |out|, with |v| <= 1: atol 1.5 eps32 / min(std), rtol 2.5 eps32 (-> 3).
        torch.testing.assert_close(out, ref, rtol=3 * EPS32, atol=1.5 * EPS32 / min(std))
        half = apply(self.x, p, (20, 24), mean, std, dtype=torch.bfloat16, channels_last=True)
        self.assertEqual(half.dtype, torch.bfloat16)
        # Bitwise: the same float32 values, each rounded to bfloat16 to nearest even on both sides.
        self.assertTrue(torch.equal(half, out.permute(0, 2, 3, 1).to(torch.bfloat16)))

    def test_resized_crop_is_interpolate_of_the_box(self):
        idx = torch.arange(100, 108)
        p = sample(idx, 20, 24, size=(10, 12), crop="resized", seed=3, epoch=2)
        out = apply(self.x, p, (10, 12))
        # Both compute the source coordinate (o + 0.5) * fl(box / out) - 0.5 in float32 (<= 2 roundings of a
        # coordinate below max(H, W) = 24 per side), whose error moves the interpolation weight by as much
        # and the value by that times a texel difference (<= 1); per axis 2 eps32 x 24. The two lerps and
        # the / 255 round 4 times per side (values <= 1): 4 eps32 more.
        atol = EPS32 * (2 * 2 * max(self.x.shape[1:3]) + 4)
        for i in range(8):
            x0, y0, w, h = (int(v) for v in p[i, :4])
            box = as_float(self.x[i:i + 1])[:, :, y0:y0 + h, x0:x0 + w]
            ref = F.interpolate(box, size=(10, 12), mode="bilinear", align_corners=False)
            torch.testing.assert_close(out[i:i + 1], ref, rtol=0, atol=atol)

    def test_brightness_and_grayscale_formulas(self):
        p = sample(torch.arange(8), 20, 24, color=(0.5, 0.0, 0.0, 0.0), gray=1.0, seed=1)
        out = apply(self.x, p, (20, 24))
        v = as_float(self.x).double() * p[:, BRIGHT].double().view(8, 1, 1, 1)
        gray = (0.299 * v[:, 0] + 0.587 * v[:, 1] + 0.114 * v[:, 2]).clamp(0, 1)
        # Against float64 (exact but for as_float's x / 255: u |v|): Ember's float32 x * fl(1/255) (2u |v|),
        # the matrix entries fl(fl(w) b) (2u), three products and two sums (3u of sum |terms| <= b): 7u b;
        # together <= 8u b = 4 eps32 x max brightness (the clamp only brings values closer).
        atol = 4 * EPS32 * p[:, BRIGHT].max().item()
        torch.testing.assert_close(out.double(), gray.unsqueeze(1).expand(8, 3, 20, 24), rtol=0, atol=atol)

    def test_hue_turns_as_torchvision_adjust_hue(self):
        # Ember's hue is DALI's YIQ rotation, torchvision's an HSV shift: the
        # two agree on the direction and within a few degrees on the angle.
        # A red pixel turned by +1/12 goes toward yellow (torchvision gives
        # (200, 120, 40)), never toward magenta.
        import colorsys
        from torchvision.transforms.v2 import functional as TF
        g = torch.Generator().manual_seed(3)
        n = 64
        x = torch.randint(0, 256, (n, 1, 1, 3), dtype=torch.uint8, generator=g)
        x[0, 0, 0] = torch.tensor([200, 40, 40], dtype=torch.uint8)
        shift = (torch.rand(n, generator=g) * 0.2 + 0.02) * torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
        shift[0] = 1 / 12
        p = sample(torch.arange(n), 1, 1)
        p[:, HUE] = shift
        ours = apply(x, p, (1, 1)).view(n, 3)
        checked, errors = 0, []
        for i in range(n):
            v = as_float(x[i:i + 1]).view(3)
            h0, s0, _ = colorsys.rgb_to_hsv(*v.tolist())
            if s0 < 0.3:  # hue is ill-defined near the gray axis
                continue
            want = TF.adjust_hue(v.view(3, 1, 1), float(shift[i])).view(3)
            h_want = colorsys.rgb_to_hsv(*want.tolist())[0]
            h_ours = colorsys.rgb_to_hsv(*ours[i].tolist())[0]
            turned = (h_ours - h0 + 0.5) % 1 - 0.5
            self.assertEqual(turned > 0, float(shift[i]) > 0, f"pixel {v.tolist()} shift {float(shift[i])}")
            error = abs((h_ours - h_want + 0.5) % 1 - 0.5)
            self.assertLess(error, 0.1, f"pixel {v.tolist()}")
            errors.append(error)
            checked += 1
        self.assertGreater(checked, 20)
        self.assertLess(sum(errors) / len(errors), 0.03)  # a few degrees on average
        red = ours[0] * 255
        self.assertGreater(float(red[1]), float(red[2]) + 40)  # green up, blue down: toward yellow

    def test_erasing(self):
        p = sample(torch.arange(8), 20, 24, erase=1.0, seed=2)
        out = apply(self.x, p, (20, 24), erase_value=7.0)
        plain = apply(self.x, sample(torch.arange(8), 20, 24), (20, 24))
        for i in range(8):
            x0, y0, w, h = (int(v) for v in p[i, EX0:EH + 1])
            self.assertGreater(w * h, 0)
            mask = torch.zeros(20, 24, dtype=torch.bool)
            mask[y0:y0 + h, x0:x0 + w] = True
            self.assertTrue(bool((out[i][:, mask] == 7.0).all()))
            self.assertTrue(torch.equal(out[i][:, ~mask], plain[i][:, ~mask]))

    def test_same_samples_same_output_whatever_the_split(self):
        kw = dict(size=(12, 12), crop="resized", hflip=0.5, color=(0.4, 0.4, 0.4, 0.1), erase=0.5, seed=9, epoch=4)
        idx = torch.arange(50, 58)
        whole = apply(self.x, sample(idx, 20, 24, **kw), (12, 12))
        a = apply(self.x[:3], sample(idx[:3], 20, 24, **kw), (12, 12))
        b = apply(self.x[3:], sample(idx[3:], 20, 24, **kw), (12, 12))
        # Bitwise: each output pixel is computed by the same per-pixel code from its own sample's row,
        # whatever the batch (the same computation).
        self.assertTrue(torch.equal(whole, torch.cat([a, b])))
        other = apply(self.x, sample(idx, 20, 24, **dict(kw, epoch=5)), (12, 12))
        self.assertFalse(torch.equal(whole, other))

    def test_bad_arguments_raise(self):
        p = sample(torch.arange(8), 20, 24)
        with self.assertRaisesRegex(RuntimeError, r"\[augment\] images must be uint8"):
            apply(self.x.float(), p, (20, 24))
        with self.assertRaisesRegex(RuntimeError, r"params must be float32 \[8, 15\]"):
            apply(self.x, p[:4], (20, 24))
        with self.assertRaisesRegex(RuntimeError, "unknown crop mode 'bogus'; choose none, pad or resized"):
            sample(torch.arange(8), 20, 24, crop="bogus")


class AugmentOpsCuda(WithLibrary):
    @unittest.skipUnless(torch.cuda.is_available(), "no CUDA device")
    def test_cuda_dispatch_equals_cpu(self):
        p = sample(torch.arange(8), 20, 24, size=(16, 16), crop="resized", hflip=0.5, color=(0.4, 0.4, 0.4, 0.1),
                   erase=0.5, seed=5)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            cpu = apply(self.x, p, (16, 16), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), dtype=dtype)
            gpu = apply(self.x.cuda(), p.cuda(), (16, 16), (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), dtype=dtype)
            self.assertTrue(gpu.is_cuda)
            # Bitwise: one per-pixel source (lib/src/augment/pixel.h) compiled without contraction on both
            # sides, only correctly rounded IEEE operations (the same computation).
            self.assertTrue(torch.equal(gpu.cpu(), cpu), dtype)


if __name__ == "__main__":
    if not LIB:
        sys.exit("usage: ops_test.py /path/to/libember.so [--cpu | --cuda]")
    if MODE == "--cuda" and not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        sys.exit(77)
    tests = {"--cpu": ["AugmentOps"], "--cuda": ["AugmentOpsCuda"]}.get(MODE, ["AugmentOps", "AugmentOpsCuda"])
    unittest.main(defaultTest=tests, verbosity=2)
