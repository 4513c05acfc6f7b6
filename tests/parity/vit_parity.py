#!/usr/bin/env python3
"""timm's Vision Transformer into Ember and back (models::ViT, train::load_pretrained).

timm's VisionTransformer (random weights, eval mode, nothing downloaded), its
state dict saved with safetensors as timm users save it, loaded by
tests/parity/pretrained_driver.cpp:
  1. vit_small_patch16_224 (12 blocks, 384 wide, 6 heads) on two 224 x 224
     images: Ember's logits equal timm's within 1e-5 of the largest logit
     (the issue's bound). The same ATen operations in the same order (conv2d
     for the patches, cat and add of the class token and the position
     table, layer_norm, scaled_dot_product_attention with its default scale
     as timm's fused path calls it, gelu, the class token's row) but for the
     Linear layers on [B,N,D] tokens: PyTorch's nn.Linear is at::linear, one
     addmm with the bias added inside the GEMM, LibTorch's F::linear a
     matmul and then `+= bias`, which BLAS may round differently (one
     rounding per output plus the blocking of the sums); whether the logits
     came out bitwise equal is printed;
  2. a 2-block ViT saved at 32 x 32 images (a 4 x 4 patch grid) and built at
     48 x 48 (6 x 6): Ember resamples the position table while loading
     (ViTImpl::timm_map) with the same F.interpolate (bicubic, antialiased)
     as timm's checkpoint_filter_fn: the table bitwise equal to timm's, the
     logits within the same bound of those of timm's model built at 48;
  3. Ember's export (save_safetensors: the same names) loads in timm's model
     with load_state_dict(strict=True), every tensor as it was, the same
     logits;
  4. fine-tuning with another number of classes: --reinit head. leaves the
     head as initialised and loads the rest, strict.

    python3 tests/parity/vit_parity.py build/tests/ember_pretrained_driver WORK
"""
import sys
from pathlib import Path

import torch
from logits_check import check, close, run
from safetensors.torch import load_file, save_file
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn


def make(seed, **kw):
    torch.manual_seed(seed)
    return VisionTransformer(**kw).eval()


def images(out, size, seed=2):
    torch.manual_seed(seed)
    x = torch.randn(2, 3, size, size)
    save_file({"x": x}, out / f"x{size}.safetensors")
    return x


def vit_small(driver, work):
    out = work / "vit_small"
    out.mkdir(parents=True, exist_ok=True)
    kw = dict(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6)
    model = make(1, **kw)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, out / "vit.safetensors")
    x = images(out, 224)
    with torch.no_grad():
        want = model(x)
    report = run(driver, "--model", "vit_small_patch16_224", "--weights", out / "vit.safetensors", "--input",
                 out / "x224.safetensors", "--out", out / "y.safetensors", "--export", out / "export.safetensors")
    n = len(model.state_dict())
    check(f"loaded {n} " in report and "missing 0 unexpected 0 mismatched 0" in report, report)
    got = load_file(out / "y.safetensors")["y"]
    print(f"vit_small_patch16_224: {n} tensors loaded; logits vs timm's: {close(got, want, 'vit_small_patch16_224')}")

    back = make(9, **kw)
    back.load_state_dict(load_file(out / "export.safetensors"), strict=True)
    for k, v in model.state_dict().items():
        check(torch.equal(back.state_dict()[k], v), f"{k} changed on the way through Ember")
    with torch.no_grad():
        check(torch.equal(back(x), want), "the export computes other logits")
    print("vit_small_patch16_224: Ember's export loads in timm's model (strict), every tensor as it was")

    report = run(driver, "--model", "vit_small_patch16_224", "--weights", out / "vit.safetensors", "--input",
                 out / "x224.safetensors", "--out", out / "y5.safetensors", "--num-classes", "5", "--reinit", "head.")
    check(f"loaded {n - 2} reinitialised 2 missing 0 unexpected 0 mismatched 0" in report, report)
    check(load_file(out / "y5.safetensors")["y"].shape == (2, 5), "a 5-class head gives 5 logits")
    print("vit_small_patch16_224: a new 5-class head (--reinit head.), the rest loaded strict")


def vit_resized(driver, work):
    out = work / "vit_2block"
    out.mkdir(parents=True, exist_ok=True)
    kw = dict(patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)
    saved = make(3, img_size=32, **kw)
    state = {k: v.contiguous() for k, v in saved.state_dict().items()}
    save_file(state, out / "vit32.safetensors")
    x = images(out, 48)
    timm48 = make(4, img_size=48, **kw)
    timm48.load_state_dict(checkpoint_filter_fn(dict(state), timm48), strict=True)
    check(timm48.pos_embed.shape == (1, 37, 64), f"timm's resampled table {tuple(timm48.pos_embed.shape)}")
    with torch.no_grad():
        want = timm48(x)
    report = run(driver, "--model", "vit:2,4,64,8,48", "--num-classes", "10", "--weights", out / "vit32.safetensors",
                 "--input", out / "x48.safetensors", "--out", out / "y.safetensors", "--export", out / "e.safetensors")
    check("missing 0 unexpected 0 mismatched 0" in report and "resized pos_embed" in report, report)
    check(torch.equal(load_file(out / "e.safetensors")["pos_embed"], timm48.pos_embed.detach()),
          "Ember's resampled position table differs from timm's")
    got = load_file(out / "y.safetensors")["y"]
    print("vit 2 blocks saved at 32 px, run at 48 px: pos_embed resampled 4x4 -> 6x6, bitwise timm's; "
          f"logits vs timm's: {close(got, want, '2-block ViT, 32 -> 48 pixels')}")


def main():
    driver, work = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    work.mkdir(parents=True, exist_ok=True)
    vit_resized(driver, work)
    vit_small(driver, work)


if __name__ == "__main__":
    main()
