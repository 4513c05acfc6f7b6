"""The JPEG shards the pack carries for the data rows (long_rows.py): made here once per build tree by
tools/dev/device_pack.py (make_jpegs with PIL and numpy, which the GPU machine lacks and this package
does not import; `ember_shards write`), found there under .device/data/jpeg/, and read there many
times over in one epoch (repeated_manifest).

The images are of ImageNet's typical pixel size (the longer side 500, the other 333..500), JPEG
quality 90 with 4:2:0 chroma (PIL's default), 8 classes: class k's colour is a corner of the RGB
cube (each channel 64 or 192) under a smooth random field of +-60, so a small ResNet tells them
apart within a few dozen steps and a loader that mixes up images and labels scores near chance
(1/8). Being smooth they are about 25 KB each, a quarter of an average ImageNet JPEG (~110 KB):
what the pack's 64 MiB allow (device_pack.py weighs it); the entropy decoding is lighter than a
photo's, the pixels (inverse DCT, colour conversion, crop) the same.
"""
import json
from pathlib import Path

PACKED = Path("data") / "jpeg"  # below .device/: train.json, val.json and their shards
CLASSES = 8
SPLITS = (("train", 48, 0), ("val", 24, 1))  # (name, images, seed): 6 and 3 per class
SAMPLES_PER_SHARD = 8
QUALITY = 90
VERSION = 1  # of the images' recipe above: a build's cached set is made again when it changes


def class_colour(k):
    """Class k's RGB colour: the corner of the cube whose channel b is 192 when bit b of k is set, else 64."""
    return tuple(64 + 128 * ((k >> b) & 1) for b in range(3))


def repeated_manifest(src, dst, times):
    """Writes dst: the manifest src's shard list `times` over, its relative URLs made absolute (dst may
    lie elsewhere), so that one epoch reads every sample `times` times, each visit a sample of its own
    (its own crop and flip). Returns the samples of one epoch."""
    src, dst = Path(src), Path(dst)
    j = json.loads(src.read_text())
    entries = []
    for e in j["shardlist"]:
        url = e["url"]
        if not url.startswith(("/", "http://", "https://", "pipe:")):
            url = str((src.parent / url).resolve())
        entries.append(dict(e, url=url))
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(dict(j, name=f"{j.get('name', src.stem)} x{times}", shardlist=entries * times),
                              indent=1) + "\n")
    return times * sum(int(e.get("nsamples", 0)) for e in entries)


def split_images(folder, split):
    """The images of a split of the set in `folder` (its manifest's nsamples)."""
    j = json.loads((Path(folder) / f"{split}.json").read_text())
    return sum(int(e.get("nsamples", 0)) for e in j["shardlist"])
