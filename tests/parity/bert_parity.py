#!/usr/bin/env python3
"""BERT from Hugging Face into Ember and back (models::Bert, train::load_pretrained, save_pretrained).

transformers' BertForSequenceClassification (2 layers, random weights, eval
mode, its sdpa attention, nothing downloaded), saved with save_pretrained as
its users save it, loaded by tests/parity/pretrained_driver.cpp:
  1. Ember's logits equal transformers' within 1e-5 of the largest logit
     (the issue's bound), with a padding mask and two segments of token types
     and without either. The same ATen operations in the same order
     (embedding sums, layer_norm, Linear, scaled_dot_product_attention with
     the additive mask transformers builds, gelu, tanh); one difference:
     transformers expands the mask to [B,1,T,T] in memory, Ember passes it
     [B,1,1,T] broadcast (the same values added); whether the logits came out
     bitwise equal is printed;
  2. the checkpoint in shards with an index loads to the same logits as the
     single file, bitwise;
  3. the same weights in BertModel's naming (no "bert." prefix) with the
     classifier beside them: the same logits, bitwise;
  4. a BertForPreTraining file in the old naming of the Hub's
     bert-base-uncased (LayerNorm.gamma/beta, the pre-training heads cls.*,
     embeddings.position_ids, no classifier) is refused strict, naming the
     missing classifier, and loads with --reinit classifier.: every other
     tensor equal to the file's (as load_state_dict of its bert.* tensors
     into BertForSequenceClassification gives them);
  5. Ember's export (model.safetensors and config.json) loads in
     BertForSequenceClassification.from_pretrained with every tensor as it
     was: the same logits, bitwise;
  6. with a quarter of the heads of every layer removed by Ember
     (prune::prune_heads), config.json lists them as pruned_heads and
     from_pretrained rebuilds the pruned model with every tensor equal to
     transformers' own prune_heads of the original model, whose logits equal
     Ember's pruned logits within 1e-5 of the largest.

    python3 tests/parity/bert_parity.py build/tests/ember_pretrained_driver WORK
"""
import copy
import json
import subprocess
import sys
from pathlib import Path

import torch
from logits_check import check, close, run
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertForPreTraining, BertForSequenceClassification


def main():
    driver, work = sys.argv[1], Path(sys.argv[2])
    torch.set_num_threads(1)
    work.mkdir(parents=True, exist_ok=True)
    config = BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=128, intermediate_size=256,
                        vocab_size=1000, max_position_embeddings=64, num_labels=3)
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    check(model.config._attn_implementation == "sdpa", f"transformers chose {model.config._attn_implementation}")
    spec = "bert:2,4,128,256,1000,64,3"
    model.save_pretrained(work / "hf")
    n = len(load_file(work / "hf" / "model.safetensors"))

    torch.manual_seed(2)
    ids = torch.randint(1, config.vocab_size, (3, 24))
    mask = torch.ones_like(ids)
    mask[1, 15:] = 0  # padded sequences
    mask[2, 6:] = 0
    ids[mask == 0] = config.pad_token_id
    types = torch.zeros_like(ids)
    types[:, 10:] = 1
    save_file({"x": ids, "mask": mask, "types": types}, work / "x.safetensors")
    plain = ids.masked_fill(mask == 0, 1)  # no padding tokens where no mask says so
    save_file({"x": plain}, work / "x_plain.safetensors")
    with torch.no_grad():
        want = model(ids, attention_mask=mask, token_type_ids=types).logits
        want_plain = model(plain).logits

    # 1. logits, with and without the mask and token types
    report = run(driver, "--model", spec, "--weights", work / "hf", "--input", work / "x.safetensors",
                 "--out", work / "y.safetensors", "--export-hf", work / "export")
    check(f"loaded {n} " in report and "missing 0 unexpected 0 mismatched 0" in report, report)
    got = load_file(work / "y.safetensors")["y"]
    print(f"bert-2layer: {n} tensors loaded; logits with padding and token types: {close(got, want, 'masked')}")
    run(driver, "--model", spec, "--weights", work / "hf", "--input", work / "x_plain.safetensors",
        "--out", work / "y_plain.safetensors")
    got_plain = load_file(work / "y_plain.safetensors")["y"]
    print(f"bert-2layer: without mask and token types: {close(got_plain, want_plain, 'plain')}")

    # 2. shards with an index
    model.save_pretrained(work / "shards", max_shard_size="300KB")
    check((work / "shards" / "model.safetensors.index.json").exists(), "no index written")
    report = run(driver, "--model", spec, "--weights", work / "shards", "--input", work / "x.safetensors",
                 "--out", work / "y2.safetensors")
    files = int(report.split("files ")[1])
    check(files > 1, report)
    check(torch.equal(load_file(work / "y2.safetensors")["y"], got), "shards give other logits")
    print(f"bert-2layer: the same checkpoint in {files} shards with an index: the same logits, bitwise")

    # 3. BertModel's naming, the classifier beside it
    body = {k: v.contiguous() for k, v in model.bert.state_dict().items()}
    body.update({f"classifier.{k}": v for k, v in model.classifier.state_dict().items()})
    save_file(body, work / "bertmodel.safetensors", metadata={"format": "pt"})
    run(driver, "--model", spec, "--weights", work / "bertmodel.safetensors", "--input", work / "x.safetensors",
        "--out", work / "y3.safetensors")
    check(torch.equal(load_file(work / "y3.safetensors")["y"], got), "BertModel naming gives other logits")
    print("bert-2layer: the same weights in BertModel's naming: the same logits, bitwise")

    # 4. a pre-training file in the old naming, as the Hub's bert-base-uncased
    torch.manual_seed(4)
    pretraining = BertForPreTraining(config).eval()
    old = {}
    for k, v in pretraining.state_dict().items():
        k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
        old[k] = v.contiguous().clone()  # the tied decoder weight is its own tensor in a file
    old["bert.embeddings.position_ids"] = torch.arange(config.max_position_embeddings).view(1, -1)
    save_file(old, work / "old.safetensors", metadata={"format": "pt"})
    r = subprocess.run([driver, "--model", spec, "--weights", str(work / "old.safetensors"),
                                      "--input", str(work / "x.safetensors"), "--out", str(work / "y4.safetensors")],
                                     capture_output=True, text=True, timeout=900)
    check(r.returncode == 1 and "classifier.weight" in r.stderr and "classifier.bias" in r.stderr,
          f"a file without the classifier was not refused by name: {r.returncode} {r.stderr[-2000:]}")
    report = run(driver, "--model", spec, "--weights", work / "old.safetensors", "--input", work / "x.safetensors",
                 "--out", work / "y4.safetensors", "--reinit", "classifier.", "--export-hf", work / "from_old")
    check("reinitialised 2 missing 0 unexpected 0" in report, report)
    reference = BertForSequenceClassification(config)  # the pre-trained body under a new classifier
    missing, unexpected = reference.load_state_dict(
        {k: v for k, v in pretraining.state_dict().items() if k.startswith("bert.")}, strict=False)
    check(sorted(missing) == ["classifier.bias", "classifier.weight"] and not unexpected, f"{missing} {unexpected}")
    exported = load_file(work / "from_old" / "model.safetensors")
    for k, v in reference.state_dict().items():
        if not k.startswith("classifier."):
            check(torch.equal(exported[k], v), f"{k}: not the old file's tensor")
    print("bert-2layer: a BertForPreTraining file in the old naming (gamma/beta, cls.*, position_ids): refused "
          "without the classifier, loaded with --reinit classifier., every other tensor the file's")

    # 5. the export back into transformers
    back = BertForSequenceClassification.from_pretrained(work / "export").eval()
    for k, v in model.state_dict().items():
        check(torch.equal(back.state_dict()[k], v), f"{k} changed on the way through Ember")
    with torch.no_grad():
        check(torch.equal(back(ids, attention_mask=mask, token_type_ids=types).logits, want),
              "the export computes other logits")
    print("bert-2layer: Ember's export loads in BertForSequenceClassification.from_pretrained, every tensor as it was")

    # 6. heads removed by Ember, rebuilt by from_pretrained from pruned_heads
    quarter = max(1, config.num_attention_heads // 4)
    chosen = {i: sorted(torch.randperm(config.num_attention_heads, generator=torch.Generator().manual_seed(i))[
        :quarter].tolist()) for i in range(config.num_hidden_layers)}
    arg = ";".join(f"{i}:{','.join(map(str, h))}" for i, h in chosen.items())
    run(driver, "--model", spec, "--weights", work / "hf", "--input", work / "x.safetensors",
        "--out", work / "yp.safetensors", "--prune-heads", arg, "--export-hf", work / "pruned")
    cfg = json.loads((work / "pruned" / "config.json").read_text())
    check({int(k): sorted(v) for k, v in cfg["pruned_heads"].items()} == chosen,
          f"config.json pruned_heads {cfg['pruned_heads']} != {chosen}")
    pruned = BertForSequenceClassification.from_pretrained(work / "pruned").eval()
    check(all(pruned.bert.encoder.layer[i].attention.self.num_attention_heads == config.num_attention_heads - quarter
              for i in range(config.num_hidden_layers)), "from_pretrained did not prune the heads")
    ref = copy.deepcopy(model)
    ref.prune_heads(chosen)  # transformers' own removal of the same heads from the original weights
    for k, v in ref.state_dict().items():
        check(torch.equal(pruned.state_dict()[k], v), f"{k} is not what transformers' prune_heads keeps")
    with torch.no_grad():
        want_p = ref(ids, attention_mask=mask, token_type_ids=types).logits
    got_p = load_file(work / "yp.safetensors")["y"]
    print(f"bert-2layer: {quarter} of {config.num_attention_heads} heads removed per layer by Ember, loaded by "
          f"from_pretrained (pruned_heads): {close(got_p, want_p, 'pruned')}")


if __name__ == "__main__":
    main()
