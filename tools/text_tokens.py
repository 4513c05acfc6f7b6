"""Text to llm.c token files, with a tokenizer file the user gives.

    tools/ember shards tokenize TEXT OUT_DIR --tokenizer tokenizer.json
        [--tokens-per-shard N] [--val-fraction F] [--format gpt2|llama3] [--eot TOKEN]

TEXT is a file, or a folder whose regular files without an extension are read
in name order (as Ember's data.path reads text). The tokenizer is a Hugging
Face `tokenizers` file (tokenizer.json; `pip install tokenizers` where it is
not installed). Each file is encoded in pieces of about 1 MiB cut at line
ends, so that memory stays small; with --eot the named token (e.g.
"<|endoftext|>") is put before each file, as llm.c's preprocessing puts it
before each document. The tokens go to OUT_DIR/train-NNNNNN.bin (and
val-NNNNNN.bin: the last --val-fraction of them) in llm.c's format: a header
of 256 int32 (magic 20240520 and version 1 for uint16 tokens, 20240801 and 7
for uint32), then the tokens; each file is written to a temporary name and
renamed when whole. char_gpt trains on them with data.tokens=OUT_DIR/train-{000000..N}.bin
and data.vocab_size set to the tokenizer's vocabulary.
"""
import argparse
import os
import sys
from pathlib import Path

import numpy as np

FORMATS = {"gpt2": (20240520, 1, np.uint16), "llama3": (20240801, 7, np.uint32)}
PIECE = 1 << 20


def text_files(path):
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and not f.is_symlink() and "." not in f.name)
        if files:
            return files
    raise SystemExit(f"tokenize: {path}: no text file (a file, or a folder of files without an extension)")


def pieces(path):
    """The file's text in pieces of about PIECE bytes, cut after a newline."""
    with open(path, "r", encoding="utf-8", errors="replace", newline="") as f:
        buffer = ""
        for line in f:
            buffer += line
            if len(buffer) >= PIECE:
                yield buffer
                buffer = ""
        if buffer:
            yield buffer


def write_token_file(path, tokens, fmt):
    magic, version, dtype = FORMATS[fmt]
    header = np.zeros(256, dtype=np.int32)
    header[0], header[1], header[2] = magic, version, len(tokens)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=dtype).tobytes())
    os.replace(tmp, path)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="tools/ember shards tokenize", description=__doc__.split("\n")[0])
    ap.add_argument("text")
    ap.add_argument("out_dir")
    ap.add_argument("--tokenizer", required=True, help="a tokenizers file (tokenizer.json)")
    ap.add_argument("--tokens-per-shard", type=int, default=100_000_000)
    ap.add_argument("--val-fraction", type=float, default=0.0)
    ap.add_argument("--format", choices=sorted(FORMATS), help="default: gpt2 (uint16) when the vocabulary fits")
    ap.add_argument("--eot", help="a token put before each file (e.g. '<|endoftext|>')")
    a = ap.parse_args(argv)
    if not 0 <= a.val_fraction < 1 or a.tokens_per_shard < 1:
        ap.error("--val-fraction is in [0, 1) and --tokens-per-shard >= 1")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise SystemExit("tokenize: the Python package 'tokenizers' is not installed here; "
                         "install it (.venv/bin/pip install tokenizers), or use 'shards write TEXT OUT --from text' "
                         "for one token per byte")
    tok = Tokenizer.from_file(a.tokenizer)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    fmt = a.format or ("gpt2" if vocab <= 1 << 16 else "llama3")
    if FORMATS[fmt][2] == np.uint16 and vocab > 1 << 16:
        raise SystemExit(f"tokenize: a vocabulary of {vocab} does not fit uint16 tokens: use --format llama3")
    eot = None
    if a.eot is not None:
        eot = tok.token_to_id(a.eot)
        if eot is None:
            raise SystemExit(f"tokenize: the tokenizer has no token {a.eot!r}")
    ids = []
    for path in text_files(a.text):
        if eot is not None:
            ids.append(eot)
        for piece in pieces(path):
            ids.extend(tok.encode(piece, add_special_tokens=False).ids)
    tokens = np.asarray(ids, dtype=np.int64)
    n_val = int(round(a.val_fraction * len(tokens)))
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", tokens[: len(tokens) - n_val]), ("val", tokens[len(tokens) - n_val:])):
        if len(part) == 0:
            continue
        count = (len(part) + a.tokens_per_shard - 1) // a.tokens_per_shard
        for i in range(count):
            write_token_file(out / f"{name}-{i:06d}.bin", part[i * a.tokens_per_shard:(i + 1) * a.tokens_per_shard], fmt)
        print(f"[tokenize] {out}: {len(part)} tokens in {count} token files: "
              f"{out}/{name}-{{000000..{count - 1:06d}}}.bin (vocabulary {vocab}, {fmt} format)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
