#!/usr/bin/env python3
"""GPT-2 from Hugging Face into Ember and back (models::Gpt2, train::load_pretrained, save_pretrained).

transformers' GPT2LMHeadModel (random weights, eval mode, nothing downloaded),
saved with save_pretrained as its users save it (model.safetensors without the
tied lm_head.weight, or shards with model.safetensors.index.json), loaded by
tests/parity/pretrained_driver.cpp:
  1. a 2-layer configuration and the 124M one (12 layers, 768 wide, 50257
     tokens): Ember's logits equal transformers' within 1e-5 of the largest
     logit (the issue's bound). The same ATen operations in the same order
     (embedding, layer_norm, scaled_dot_product_attention with is_causal,
     gelu_new written out, the tied head) but for the projections:
     transformers' Conv1D is one addmm with its weight stored [in, out]
     (the bias added inside the GEMM), Ember's Linear is LibTorch's
     F::linear, a matmul by the transpose view of [out, in] and then
     `+= bias`: another operand layout and another place for the bias add,
     which BLAS may round differently (one rounding per output plus the
     blocking of the sums); whether the logits came out bitwise equal is
     printed;
  2. the 124M checkpoint in shards with an index loads to the same logits as
     the single file, bitwise (the same tensors, the same computation);
  3. a GPT2Model file (the Hub's original gpt2 naming: no "transformer."
     prefix, the causal-mask buffers attn.bias) loads to the same logits;
  4. Ember's export (Hugging Face naming, Conv1D weights transposed back,
     config.json) loads in GPT2LMHeadModel.from_pretrained with every tensor
     as it was: the same logits as the original, bitwise;
  5. with a quarter of the heads of every block removed by Ember
     (prune::prune_heads), the export's config.json lists them as
     pruned_heads and from_pretrained rebuilds the pruned model with every
     tensor equal to transformers' own prune_heads of the original model
     (so Ember removed the same rows and columns), whose logits equal Ember's
     pruned logits within 1e-5 of the largest.

    python3 tests/parity/gpt2_parity.py build/tests/ember_pretrained_driver WORK [--small]
"""
import copy
import json
import sys
from pathlib import Path

import torch
from logits_check import check, close, run
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel


def make(config, seed):
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    return model.eval()


def spec(config):
    return f"gpt2:{config.n_layer},{config.n_head},{config.n_embd},{config.vocab_size},{config.n_positions}"


def case(driver, work, label, config, tokens, sharded=False, gpt2model=False, prune=True):
    model = make(config, seed=config.n_layer)
    out = work / label
    model.save_pretrained(out / "hf")
    torch.manual_seed(2)
    x = torch.randint(0, config.vocab_size, (2, tokens))
    save_file({"x": x}, out / "x.safetensors")
    with torch.no_grad():
        want = model(x).logits
    ember = spec(config)
    report = run(driver, "--model", ember, "--weights", out / "hf", "--input", out / "x.safetensors",
                 "--out", out / "y.safetensors", "--export-hf", out / "export")
    n = len(load_file(out / "hf" / "model.safetensors"))
    check(f"loaded {n} " in report and "missing 0 unexpected 0 mismatched 0" in report, report)
    got = load_file(out / "y.safetensors")["y"]
    print(f"{label}: {n} tensors loaded; logits vs transformers': {close(got, want, label)}")

    if sharded:
        model.save_pretrained(out / "shards", max_shard_size="100MB")
        check((out / "shards" / "model.safetensors.index.json").exists(), "no index written")
        report = run(driver, "--model", ember, "--weights", out / "shards", "--input", out / "x.safetensors",
                     "--out", out / "y2.safetensors")
        files = int(report.split("files ")[1])
        check(files > 1, report)
        check(torch.equal(load_file(out / "y2.safetensors")["y"], got), f"{label}: shards give other logits")
        print(f"{label}: the same checkpoint in {files} shards with an index: the same logits, bitwise")

    if gpt2model:  # the Hub's original layout: GPT2Model names and the causal-mask buffers
        body = {k: v.contiguous() for k, v in model.transformer.state_dict().items()}
        for i in range(config.n_layer):
            body[f"h.{i}.attn.bias"] = torch.tril(torch.ones(config.n_positions, config.n_positions)).view(
                1, 1, config.n_positions, config.n_positions)
        save_file(body, out / "gpt2model.safetensors", metadata={"format": "pt"})
        run(driver, "--model", ember, "--weights", out / "gpt2model.safetensors", "--input", out / "x.safetensors",
            "--out", out / "y3.safetensors")
        check(torch.equal(load_file(out / "y3.safetensors")["y"], got), f"{label}: GPT2Model naming differs")
        print(f"{label}: the same weights in GPT2Model's naming with mask buffers: the same logits, bitwise")

    back = GPT2LMHeadModel.from_pretrained(out / "export").eval()
    for k, v in model.state_dict().items():
        check(torch.equal(back.state_dict()[k], v), f"{label}: {k} changed on the way through Ember")
    with torch.no_grad():
        check(torch.equal(back(x).logits, want), f"{label}: the export computes other logits")
    print(f"{label}: Ember's export loads in GPT2LMHeadModel.from_pretrained, every tensor as it was")

    if prune:
        quarter = max(1, config.n_head // 4)
        chosen = {i: sorted(torch.randperm(config.n_head, generator=torch.Generator().manual_seed(i))[:quarter].tolist())
                  for i in range(config.n_layer)}
        arg = ";".join(f"{i}:{','.join(map(str, h))}" for i, h in chosen.items())
        run(driver, "--model", ember, "--weights", out / "hf", "--input", out / "x.safetensors",
            "--out", out / "yp.safetensors", "--prune-heads", arg, "--export-hf", out / "pruned")
        cfg = json.loads((out / "pruned" / "config.json").read_text())
        check({int(k): sorted(v) for k, v in cfg["pruned_heads"].items()} == chosen,
              f"config.json pruned_heads {cfg['pruned_heads']} != {chosen}")
        pruned = GPT2LMHeadModel.from_pretrained(out / "pruned").eval()
        check(all(pruned.transformer.h[i].attn.num_heads == config.n_head - quarter for i in range(config.n_layer)),
              "from_pretrained did not prune the heads")
        ref = copy.deepcopy(model)
        ref.prune_heads(chosen)  # transformers' own removal of the same heads from the original weights
        for k, v in ref.state_dict().items():
            check(torch.equal(pruned.state_dict()[k], v), f"{label}: {k} is not what transformers' prune_heads keeps")
        with torch.no_grad():
            want_p = ref(x).logits
        got_p = load_file(out / "yp.safetensors")["y"]
        print(f"{label}: {quarter} of {config.n_head} heads removed per block by Ember, loaded by "
              f"from_pretrained (pruned_heads): {close(got_p, want_p, label + ' pruned')}")


def main():
    driver, work = sys.argv[1], Path(sys.argv[2])
    small = "--small" in sys.argv[3:]
    torch.set_num_threads(1)
    work.mkdir(parents=True, exist_ok=True)
    case(driver, work, "gpt2-2layer", GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=64),
         tokens=24, gpt2model=True)
    if not small:
        case(driver, work, "gpt2-124M", GPT2Config(), tokens=32, sharded=True)


if __name__ == "__main__":
    main()
