"""Writes real Fashion-MNIST images (Debian's dataset-fashion-mnist IDX files)
as an image folder of 8-bit grayscale PNG files, for some of its classes:
OUT/{train,val}/<class name>/<n>.png, the first PER_TRAIN images of each class
from the training file and the first PER_VAL from the test file (pure Python:
gzip + zlib + struct).

Usage: make_fashion_folder.py IDX_DIR OUT CLASSES PER_TRAIN PER_VAL
       CLASSES: comma-separated label numbers, e.g. 0,1,2,3,4
"""
import gzip
import pathlib
import struct
import sys
import zlib

NAMES = ["tshirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle_boot"]


def idx(path, magic):
    data = gzip.open(path).read()
    got = struct.unpack(">I", data[:4])[0]
    if got != magic:
        sys.exit(f"{path}: magic {got:#010x}, expected {magic:#010x}")
    return data


def png(width, height, pixels):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + pixels[y * width:(y + 1) * width] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grayscale
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def write(images_path, labels_path, out, classes, per_class):
    images, labels = idx(images_path, 0x803), idx(labels_path, 0x801)
    n, rows, cols = struct.unpack(">III", images[4:16])
    counts = {c: 0 for c in classes}
    for i in range(n):
        c = labels[8 + i]
        if c not in counts or counts[c] >= per_class:
            continue
        folder = out / NAMES[c]
        folder.mkdir(parents=True, exist_ok=True)
        start = 16 + i * rows * cols
        (folder / f"{i}.png").write_bytes(png(cols, rows, images[start:start + rows * cols]))
        counts[c] += 1
        if all(v >= per_class for v in counts.values()):
            break


src, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
classes = [int(c) for c in sys.argv[3].split(",")]
write(src / "train-images-idx3-ubyte.gz", src / "train-labels-idx1-ubyte.gz", out / "train", classes, int(sys.argv[4]))
write(src / "t10k-images-idx3-ubyte.gz", src / "t10k-labels-idx1-ubyte.gz", out / "val", classes, int(sys.argv[5]))
