"""Writes a small CIFAR-10 in the authors' binary format (learnable: each
class has its own colour and stripe orientation, plus noise).

Usage: make_cifar.py OUT_DIR [PER_BATCH] [TEST]
Writes OUT_DIR/cifar-10-batches-bin/{data_batch_1..5,test_batch}.bin.
"""
import pathlib
import random
import sys

out = pathlib.Path(sys.argv[1]) / "cifar-10-batches-bin"
per_batch = int(sys.argv[2]) if len(sys.argv) > 2 else 100
n_test = int(sys.argv[3]) if len(sys.argv) > 3 else 200
out.mkdir(parents=True, exist_ok=True)
rng = random.Random(0)


def record(label):
    r, g, b = ((label * 83) % 256, (label * 151 + 40) % 256, (label * 29 + 200) % 256)
    planes = []
    for base in (r, g, b):
        plane = bytearray(1024)
        for y in range(32):
            for x in range(32):
                stripe = 60 if ((x if label % 2 else y) // 4) % 2 else 0
                plane[y * 32 + x] = max(0, min(255, base - 30 + stripe + rng.randint(-25, 25)))
        planes.append(bytes(plane))
    return bytes([label]) + b"".join(planes)


for i in range(1, 6):
    (out / f"data_batch_{i}.bin").write_bytes(b"".join(record(rng.randrange(10)) for _ in range(per_batch)))
(out / "test_batch.bin").write_bytes(b"".join(record(rng.randrange(10)) for _ in range(n_test)))
print(out)
