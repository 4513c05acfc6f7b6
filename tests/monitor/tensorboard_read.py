"""TensorBoard's own reader on an event file written by Ember.

The driver (tensorboard_driver.cpp) logs scalars and histograms with
ember::monitor::TensorBoardWriter and writes down what it logged. Checked here:

  1. The file name follows SummaryWriter's events.out.tfevents.<10-digit
     seconds>.<host>.<pid>.<n><suffix>.
  2. TensorBoard's EventAccumulator (size_guidance 0: every event kept) reads
     file_version 2, exactly the tags logged, and every scalar (tag, step, value
     as float32, wall time) in order.
  3. Every histogram equals what torch.utils.tensorboard's SummaryWriter
     .add_histogram(tag, values, step) would write (its make_histogram with
     SummaryWriter's default bins="tensorflow" edges, on the finite values; Ember
     skips NaN/inf): min, max, num, bucket edges and counts exactly; sum and
     sum_squares to float64 rounding (the summation order differs: within
     eps64 x n of the sum of |values| and of squares, tests/tolerance.py).
  4. Every record's framing and masked CRC-32C, recomputed with TensorBoard's
     own pure-Python CRC-32C (tensorflow_stub.pywrap_tensorflow.masked_crc32c,
     independent of the writer's table-driven CRC).
  5. CRC checking: TensorBoard's record reader (without TensorFlow installed,
     tensorflow_stub's PyRecordReader_New, which EventFileLoader uses) verifies
     both CRCs of every record: a copy with one payload byte flipped fails with
     "failed event crc32 check", one with a length byte flipped with "failed
     header crc32 check". EventFileLoader swallows that DataLossError as if the
     file were still being written: it yields the events before the bad record
     and stops, without an error.

    python tensorboard_read.py DRIVER OUT_DIR
"""
import importlib.util
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tolerance import EPS64, bound  # noqa: E402


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove: AssertionError(what) unless ok."""
    if not ok:
        raise AssertionError(what)


def framing(data):
    """(offset, length, payload) of every record; asserts the file is whole."""
    records, at = [], 0
    while at < len(data):
        (length,) = struct.unpack_from("<Q", data, at)
        records.append((at, length, data[at + 12 : at + 12 + length]))
        at += 12 + length + 4
    check(at == len(data), f"trailing bytes: {at} != {len(data)}")
    return records


def main():
    driver, out = sys.argv[1], Path(sys.argv[2])
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    t0 = time.time()
    run = subprocess.run([driver, str(out)])
    t1 = time.time()
    check(run.returncode == 0, f"driver failed with exit code {run.returncode}")
    expected = json.loads((out / "expected.json").read_text())

    # 1. File name.
    files = sorted((out / "run").iterdir())
    check(len(files) == 1, files)
    path = files[0]
    m = re.fullmatch(r"events\.out\.tfevents\.(\d{10})\.(.+)\.(\d+)\.0\.driver", path.name)
    check(m, path.name)
    check(int(t0) - 1 <= int(m[1]) <= t1 + 1, (m[1], t0, t1))
    check(m[2] == socket.gethostname(), (m[2], socket.gethostname()))
    check(int(m[3]) == expected["pid"], (m[3], expected["pid"]))

    # TensorBoard without TensorFlow reads with its stub record reader (item 5).
    has_tf = importlib.util.find_spec("tensorflow") is not None
    from tensorboard.backend.event_processing import event_accumulator as ea
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.compat.tensorflow_stub import errors, pywrap_tensorflow

    print(f"TensorBoard reader: {'TensorFlow' if has_tf else 'tensorflow_stub (no TensorFlow installed)'}")

    # 2. Scalars through EventAccumulator.
    kinds = (ea.SCALARS, ea.HISTOGRAMS, ea.COMPRESSED_HISTOGRAMS, ea.IMAGES, ea.AUDIO, ea.TENSORS)
    acc = ea.EventAccumulator(str(out / "run"), size_guidance={k: 0 for k in kinds})
    acc.Reload()
    check(acc.file_version == 2.0, acc.file_version)
    tags = acc.Tags()
    scalar_tags = sorted({s["tag"] for s in expected["scalars"]})
    histogram_tags = sorted({h["tag"] for h in expected["histograms"]})
    check(sorted(tags[ea.SCALARS]) == scalar_tags, tags)
    check(sorted(tags[ea.HISTOGRAMS]) == histogram_tags, tags)
    n_scalars = 0
    for tag in scalar_tags:
        want = [s for s in expected["scalars"] if s["tag"] == tag]
        got = acc.Scalars(tag)
        check(len(got) == len(want), (tag, len(got), len(want)))
        for g, w in zip(got, want):
            check(g.step == w["step"], (tag, g, w))
            check(g.value == float(np.float32(w["value"])), (tag, g, w))  # one rounding to float32 on both sides
            if w["wall_time"] is None:
                check(t0 - 1 <= g.wall_time <= t1 + 1, (tag, g, t0, t1))
            else:
                check(g.wall_time == w["wall_time"], (tag, g, w))
            n_scalars += 1
    print(f"scalars: {n_scalars} values of {len(scalar_tags)} tags match")

    # 3. Histograms against torch.utils.tensorboard's.
    from torch.utils.tensorboard import SummaryWriter
    from torch.utils.tensorboard.summary import make_histogram

    with tempfile.TemporaryDirectory() as tmp:
        writer = SummaryWriter(log_dir=tmp)
        bins = writer.default_bins
        writer.close()
    for tag in histogram_tags:
        want = [h for h in expected["histograms"] if h["tag"] == tag]
        got = acc.Histograms(tag)
        check(len(got) == len(want), (tag, len(got), len(want)))
        for g, w in zip(got, want):
            check(g.step == w["step"], (tag, g.step, w))
            h = g.histogram_value
            values = np.fromfile(out / w["file"], dtype=np.float64)
            finite = values[np.isfinite(values)]
            if finite.size == 0:
                check(h.num == 0 and not h.bucket and not h.bucket_limit, (tag, h))
                print(f"histogram {tag} step {g.step}: no finite value, empty")
                continue
            ref = make_histogram(finite, bins)
            check((h.min, h.max, h.num) == (ref.min, ref.max, ref.num), (tag, h, ref))
            # Two float64 sums of the same n values in another order (Ember's on the tensor, numpy's pairwise)
            # differ by at most eps64 x n x sum |x|; the squares (one more rounding each) are nonnegative,
            # so relative to their own sum.
            n = finite.size
            limit = bound(EPS64, n=n + 1)
            check(abs(h.sum - ref.sum) <= limit * float(np.abs(finite).sum()), (tag, h.sum, ref.sum, limit))
            check(abs(h.sum_squares - ref.sum_squares) <= limit * float((finite * finite).sum()),
                  (tag, h.sum_squares, ref.sum_squares, limit))
            check(list(h.bucket_limit) == list(ref.bucket_limit), (tag, h.bucket_limit, ref.bucket_limit))
            check(list(h.bucket) == list(ref.bucket), (tag, h.bucket, ref.bucket))
            in_buckets = sum(h.bucket)
            print(
                f"histogram {tag} step {g.step}: {len(h.bucket)} buckets, {int(in_buckets)} of {int(h.num)} "
                f"finite values in buckets ({values.size - finite.size} non-finite skipped), as torch"
            )

    # 4. Framing and CRCs, with TensorBoard's CRC-32C.
    data = path.read_bytes()
    records = framing(data)
    for at, length, payload in records:
        (crc_len,) = struct.unpack_from("<I", data, at + 8)
        (crc_data,) = struct.unpack_from("<I", data, at + 12 + length)
        check(crc_len == pywrap_tensorflow.masked_crc32c(data[at : at + 8]), at)
        check(crc_data == pywrap_tensorflow.masked_crc32c(payload), at)
    n_events = 1 + len(expected["scalars"]) + len(expected["histograms"])
    check(len(records) == n_events, (len(records), n_events))
    events = list(event_file_loader.EventFileLoader(str(path)).Load())
    check(len(events) == n_events and events[0].file_version == "brain.Event:2", (len(events), events[0]))
    print(f"records: {len(records)}, every length and masked CRC-32C verified")

    # 5. A corrupted byte is caught by TensorBoard's reader.
    bad_record = 3
    at, length, _ = records[bad_record]

    def corrupted(offset):
        copy = bytearray(data)
        copy[offset] ^= 0x01
        p = out / f"corrupt_{offset}.tfevents"
        p.write_bytes(bytes(copy))
        return p

    for offset, message in ((at + 12 + length // 2, "failed event crc32 check"), (at + 1, "failed header crc32 check")):
        p = corrupted(offset)
        reader = pywrap_tensorflow.PyRecordReader_New(str(p))
        for _ in range(bad_record):
            reader.GetNext()
        try:
            reader.GetNext()
            raise AssertionError(f"flipped byte at {offset} not detected")
        except errors.DataLossError as e:
            check(message in str(e), e)
            print(f"flipped byte at {offset} (record {bad_record}): DataLossError '{message}'")
        loaded = list(event_file_loader.EventFileLoader(str(p)).Load())
        check(len(loaded) == bad_record, len(loaded))
        os.remove(p)
    print(f"EventFileLoader stops silently at the corrupted record (yields the {bad_record} before it)")
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
