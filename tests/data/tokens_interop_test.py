#!/usr/bin/env python3
"""llm.c token files end to end: text -> token files -> char_gpt.

1. `tools/ember shards tokenize` (tools/text_tokens.py) with a byte-level BPE
   tokenizer trained here on the text (Hugging Face tokenizers; nothing
   downloaded): numpy reads the files as llm.c's loader reads them (the
   header's magic, version and count, uint16 tokens), and the tokenizer
   decodes them back to the text, byte for byte.
2. `ember_shards write TEXT OUT --from text`: one token per byte, the text's bytes.
3. char_gpt trains from each (data.tokens, data.val_tokens): its validation
   loss ends below ln(vocabulary), the loss of a model that knows nothing
   (uniform over the vocabulary); a run of BPE tokens prints no byte sample.

    python3 tests/data/tokens_interop_test.py --shards build/bin/ember_shards --char-gpt build/bin/char_gpt \
        --text /usr/share/games/fortunes --work /tmp/x
"""
import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent.parent / "tools"))
import text_tokens as tokenize  # noqa: E402



def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove."""
    if not ok:
        raise AssertionError(what)


def read_llmc(path):
    """llm.c's reader (dev/data/data_common.py): the header, then the tokens."""
    header = np.fromfile(path, dtype=np.int32, count=256)
    check(header[0] == 20240520 and header[1] == 1, f"{path}: header {header[:3]}")
    tokens = np.fromfile(path, dtype=np.uint16, offset=1024)
    check(len(tokens) == header[2], f"{path}: {len(tokens)} tokens, the header says {header[2]}")
    return tokens


def train(char_gpt, work, name, train_spec, val_spec, vocab):
    run = work / name
    r = subprocess.run([char_gpt, f"data.tokens={train_spec}", f"data.val_tokens={val_spec}",
                        f"data.vocab_size={vocab}", "data.block_size=32", "data.batch_size=16",
                        "model.n_layer=1", "model.n_head=2", "model.n_embd=32", "trainer.max_steps=80",
                        "trainer.epochs=1", "trainer.threads=2", "sample.length=40", f"run.dir={run}"],
                       capture_output=True, text=True, timeout=300)
    check(r.returncode == 0, f"char_gpt on {name}: exit {r.returncode}\n{r.stderr[-2000:]}")
    summary = json.loads((run / "summary.json").read_text())
    check(summary["val_loss"] < 0.9 * math.log(vocab),
          f"{name}: val_loss {summary['val_loss']:.3f}, not below 0.9 ln({vocab}) = {0.9 * math.log(vocab):.3f}")
    check("val_bpb" not in summary, f"{name}: val_bpb of tokens")
    print(f"[tokens] char_gpt on {name}: val_loss {summary['val_loss']:.3f} (ln {vocab} = {math.log(vocab):.3f})")
    return r.stdout


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shards", required=True)
    ap.add_argument("--char-gpt", required=True)
    ap.add_argument("--text", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        print("SKIP: the tokenizers package is not installed")
        return 77
    # 300 KB of the text (whole lines), as one file.
    text = "".join(p.read_text(encoding="utf-8", errors="replace") for p in tokenize.text_files(a.text))
    text = text[: text.index("\n", 300_000) + 1]
    corpus = work / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")

    # 1. BPE tokens.
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train([str(corpus)], trainers.BpeTrainer(vocab_size=512, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                 special_tokens=["<|endoftext|>"]))
    tok.save(str(work / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    check(tokenize.main([str(corpus), str(work / "bpe"), "--tokenizer", str(work / "tokenizer.json"),
                         "--val-fraction", "0.1", "--tokens-per-shard", "40000"]) == 0, "tokenize")
    files = sorted((work / "bpe").glob("*.bin"))
    train_files = [f for f in files if f.name.startswith("train-")]
    val_files = [f for f in files if f.name.startswith("val-")]
    check(len(train_files) >= 2 and len(val_files) == 1, f"token files: {[f.name for f in files]}")
    ids = np.concatenate([read_llmc(f) for f in train_files + val_files])
    check(int(ids.max()) < vocab, f"token {ids.max()} outside the vocabulary {vocab}")
    check(tok.decode(ids.tolist()) == text, "the BPE token files do not decode to the text")
    print(f"[tokens] BPE: {len(ids)} tokens of a {vocab}-token vocabulary in {len(files)} files decode to the text")

    # 2. One token per byte, by ember_shards.
    r = subprocess.run([a.shards, "write", str(corpus), str(work / "bytes"), "--from", "text", "--val-fraction", "0.1",
                        "--tokens-per-shard", "100000"], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"ember_shards write --from text: {r.stderr}")
    byte_files = sorted((work / "bytes").glob("*.bin"))
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    ordered = [f for f in byte_files if f.name.startswith("train-")] + [f for f in byte_files if f.name.startswith("val-")]
    check(np.array_equal(np.concatenate([read_llmc(f) for f in ordered]), raw), "byte token files differ from the text")
    print(f"[tokens] bytes: {len(raw)} tokens in {len(byte_files)} files, the text's bytes")

    # 3. char_gpt on each.
    out = train(a.char_gpt, work, "bpe-run", f"{work}/bpe/train-{{000000..{len(train_files) - 1:06d}}}.bin",
                str(val_files[0]), vocab)
    check("no text sample" in out, "a BPE run printed a byte sample")
    n_train = len([f for f in byte_files if f.name.startswith("train-")])
    out = train(a.char_gpt, work, "byte-run", f"{work}/bytes/train-{{000000..{n_train - 1:06d}}}.bin",
                f"{work}/bytes/val-000000.bin", 256)
    check("--- char_gpt sample" in out, "a byte-token run printed no sample")
    print("[tokens] passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
