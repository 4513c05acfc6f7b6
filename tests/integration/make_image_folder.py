"""Writes a small image folder of real PNG files (pure Python: zlib + struct):
OUT/{train,val}/<class>/<n>.png, three classes with their own colour and
stripe direction, plus noise; sizes vary (the loader resizes).

Usage: make_image_folder.py OUT [PER_CLASS_TRAIN] [PER_CLASS_VAL]
"""
import pathlib
import random
import struct
import sys
import zlib


def png(width, height, rows):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\x00" + bytes(r) for r in rows)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # 8-bit RGB
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def image(rng, label):
    w, h = rng.choice([(40, 40), (48, 40), (40, 52)])
    colours = [(200, 60, 60), (60, 200, 60), (60, 60, 200)]
    rows = []
    for y in range(h):
        row = []
        for x in range(w):
            stripe = 50 if ((x if label == 1 else y) // 5) % 2 else 0
            for c in colours[label]:
                row.append(max(0, min(255, c - 25 + stripe + rng.randint(-30, 30))))
        rows.append(row)
    return png(w, h, rows)


out = pathlib.Path(sys.argv[1])
per = {"train": int(sys.argv[2]) if len(sys.argv) > 2 else 30, "val": int(sys.argv[3]) if len(sys.argv) > 3 else 10}
rng = random.Random(0)
for split, n in per.items():
    for label, name in enumerate(["circle", "square", "triangle"]):
        d = out / split / name
        d.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            (d / f"{i:03d}.png").write_bytes(image(rng, label))
print(out)
