#!/usr/bin/env python3
"""Ember's tar reader against the writers the ecosystem uses (data/tar.h, data/shards.h).

1. Shards written by Python's tarfile in its three formats (USTAR, GNU, PAX:
   webdataset's TarWriter uses PAX), by webdataset's own TarWriter and by GNU
   tar, with long names (over 100 bytes, with and without a '/' ustar can
   split at), non-ASCII names, empty and block-sized members, directories and
   links, and a member of 2 MiB: `ember_shards list` reports the same samples,
   extensions, sizes and CRC-32s as webdataset.WebDataset (for what it reads)
   and tarfile do, in the same order.
2. `ember_shards index` writes a wids manifest that webdataset's own reader
   of shard lists accepts in form (kind, version, url, nsamples, filesize),
   and `verify` passes on the shards, then fails, naming the shard and what
   differs, on a flipped byte (crc32), a cut shard (truncated) and a manifest
   with another sample count.

    python3 tests/data/shards_interop_test.py --binary build/bin/ember_shards --work /tmp/x
"""
import argparse
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove."""
    if not ok:
        raise AssertionError(what)


def samples():
    """(name, bytes) members of a WebDataset shard exercising the formats' corners."""
    long_split = "d" * 120 + "/000002.jpg"    # ustar: prefix + name
    long_flat = "x" * 180                     # no '/' to split at: GNU long name or pax path
    out = [
        ("000000.jpg", bytes(range(256)) * 3),
        ("000000.cls", b"3"),
        ("000001.txt", b""),                   # empty
        ("000001.cls", b"7"),
        (long_split, os.urandom(512)),         # exactly one block
        (long_split[:-4] + ".json", b'{"label": 5}'),
        (long_flat + ".seg.png", os.urandom(1000)),
        (long_flat + ".cls", b"1"),
        ("caf\u00e9/\u00fcber.txt", "gr\u00fc\u00dfe".encode()),   # non-ASCII: pax path (GNU: raw bytes)
        ("caf\u00e9/\u00fcber.cls", b"2"),
        ("big/000004.bin", os.urandom(2 << 20)),
        ("big/000004.cls", b"9"),
    ]
    return out


def write_tarfile(path, members, fmt):
    with tarfile.open(path, "w", format=fmt, encoding="utf-8") as tar:
        dir_info = tarfile.TarInfo("somedir")
        dir_info.type = tarfile.DIRTYPE
        tar.addfile(dir_info)
        for i, (name, data) in enumerate(members):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 1700000000 + i
            tar.addfile(info, io.BytesIO(data))
            if i == 3:
                link = tarfile.TarInfo("a-link.jpg")
                link.type = tarfile.SYMTYPE
                link.linkname = "000000.jpg"
                tar.addfile(link)


def expected_lines(members):
    """ember_shards list's lines: key, extension (lower case), size, crc32, as webdataset groups members."""
    lines = []
    for name, data in members:
        base = name.rsplit("/", 1)[-1]
        dot = base.index(".")
        key = name[: len(name) - len(base) + dot]
        ext = base[dot + 1:].lower()
        lines.append(f"{key}\t{ext}\t{len(data)}\t{zlib.crc32(data):08x}")
    return lines


def ember_list(binary, shard):
    r = subprocess.run([binary, "list", str(shard)], capture_output=True)
    check(r.returncode == 0, f"ember_shards list {shard}: exit {r.returncode}: {r.stderr.decode(errors='replace')}")
    text = r.stdout.decode("utf-8")
    lines = [line for line in text.splitlines() if not line.startswith("#")]
    summary = [line for line in text.splitlines() if line.startswith("#")]
    return lines, summary[-1] if summary else ""


def webdataset_lines(shard):
    """What webdataset.WebDataset reads from the shard, as list's lines."""
    import webdataset as wds  # noqa: PLC0415 (the pinned peer, in the project's venv)
    lines = []
    for sample in wds.WebDataset(str(shard), shardshuffle=False, empty_check=False):
        key = sample["__key__"]
        for ext, data in sample.items():
            if ext.startswith("__"):
                continue
            lines.append(f"{key}\t{ext}\t{len(data)}\t{zlib.crc32(data):08x}")
    return lines


def part_formats(binary, work):
    members = samples()
    want = expected_lines(members)
    want_sorted_by_sample = want  # members are written sample by sample
    shards = {}
    for fmt, label in ((tarfile.USTAR_FORMAT, "ustar"), (tarfile.GNU_FORMAT, "gnu"), (tarfile.PAX_FORMAT, "pax")):
        # ustar cannot hold the 180-byte flat name: those samples are left out of its shard.
        ms = [m for m in members if not (fmt == tarfile.USTAR_FORMAT and m[0].startswith("x" * 180))]
        if fmt == tarfile.USTAR_FORMAT:
            ms = [m for m in ms if m[0].isascii()]
        path = work / f"tarfile-{label}.tar"
        write_tarfile(path, ms, fmt)
        shards[label] = (path, expected_lines(ms))
    # webdataset's TarWriter (pax, with its own member order: sorted extensions? no, the dict's order).
    import webdataset as wds  # noqa: PLC0415
    path = work / "wds-writer.tar"
    with wds.TarWriter(str(path)) as sink:
        sink.write({"__key__": "s000", "jpg": b"\xff\xd8jpeg-bytes", "cls": b"4", "json": b'{"a": 1}'})
        sink.write({"__key__": "dir/s001", "txt": "text \u00e9", "cls": b"5"})
        sink.write({"__key__": "y" * 150, "bin": os.urandom(3000), "cls": b"6"})
    shards["wds-writer"] = (path, None)  # compared with webdataset's own reading below
    # GNU tar from a folder, in name order (GNU format by default).
    src = work / "gnu-src"
    for name, data in members:
        p = src / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    path = work / "gnu-tar.tar"
    subprocess.run(["tar", "--sort=name", "--format=gnu", "-C", str(src), "-cf", str(path)] +
                   sorted(set(n.split("/")[0] for n, _ in members)), check=True)
    gnu_members = []
    with tarfile.open(path) as t:
        for info in t:
            if info.isfile():
                gnu_members.append((info.name, t.extractfile(info).read()))
    shards["gnu-tar"] = (path, expected_lines(gnu_members))

    for label, (path, expected) in shards.items():
        got, summary = ember_list(binary, path)
        wds_got = webdataset_lines(path)
        if expected is not None:
            check(got == expected, f"{label}: ember_shards list differs from the members written:\n"
                  + "\n".join(f"  got  {g}\n  want {w}" for g, w in zip(got, expected) if g != w)
                  + f"\n  ({len(got)} lines, {len(expected)} expected)")
        # webdataset's reading of the same shard: same samples, members, bytes.
        check(sorted(got) == sorted(wds_got) and len(got) == len(wds_got),
              f"{label}: Ember and webdataset read different members:\n  ember {got}\n  wds   {wds_got}")
        size = path.stat().st_size
        crc = zlib.crc32(path.read_bytes())
        check(f"{size} bytes, crc32 {crc:08x}" in summary, f"{label}: summary {summary!r}, file {size} bytes {crc:08x}")
        print(f"[interop] {label}: {len(got)} members read alike by Ember and webdataset")
    del want_sorted_by_sample
    return [p for p, _ in shards.values()]


def part_manifest(binary, work, shards):
    folder = work / "set"
    folder.mkdir()
    for i, s in enumerate(shards):
        shutil.copy(s, folder / f"train-{i:06d}.tar")
    spec = str(folder / f"train-{{000000..{len(shards) - 1:06d}}}.tar")
    manifest = folder / "index.json"
    r = subprocess.run([binary, "index", spec, "--out", str(manifest), "--name", "interop"], capture_output=True, text=True)
    check(r.returncode == 0, f"index: exit {r.returncode}: {r.stderr}")
    j = json.loads(manifest.read_text())
    check(j["__kind__"] == "wids-shard-index-v1" and j["wids_version"] == 1 and j["name"] == "interop", f"manifest {j}")
    for i, e in enumerate(j["shardlist"]):
        p = folder / f"train-{i:06d}.tar"
        check(e["url"] == str(p), f"url {e['url']}")
        check(e["filesize"] == p.stat().st_size, f"filesize {e}")
        check(e["crc32"] == f"{zlib.crc32(p.read_bytes()):08x}", f"crc32 {e}")
        import webdataset as wds  # noqa: PLC0415
        n = sum(1 for _ in wds.WebDataset(str(p), shardshuffle=False, empty_check=False))
        check(e["nsamples"] == n, f"{p.name}: nsamples {e['nsamples']}, webdataset reads {n}")
    r = subprocess.run([binary, "verify", str(manifest)], capture_output=True, text=True)
    check(r.returncode == 0, f"verify of intact shards: exit {r.returncode}: {r.stderr}")

    def verify_fails(what, needle):
        r = subprocess.run([binary, "verify", str(manifest)], capture_output=True, text=True)
        check(r.returncode == 1 and needle in r.stderr, f"{what}: exit {r.returncode}, stderr {r.stderr!r}, wanted {needle!r}")
        print(f"[interop] verify refuses {what}")

    victim = folder / "train-000001.tar"
    good = victim.read_bytes()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x01  # inside a member's data: only the checksum can tell
    victim.write_bytes(bytes(flipped))
    verify_fails("a flipped byte", f"{victim}: crc32 ")
    victim.write_bytes(good[: len(good) // 2])
    verify_fails("a cut shard", "truncated")
    victim.write_bytes(good)
    j["shardlist"][0]["nsamples"] += 1
    manifest.write_text(json.dumps(j))
    verify_fails("a wrong sample count", "samples, the manifest says")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", required=True)
    ap.add_argument("--work", required=True)
    a = ap.parse_args()
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    shards = part_formats(a.binary, work)
    part_manifest(a.binary, work, shards)
    print("[interop] passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
