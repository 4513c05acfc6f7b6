#!/usr/bin/env python3
"""Packs what the GPU check needs into .device/ (called by `tools/ember device-pack`).

    device_pack.py --build BUILD_DIR --venv-python PYTHON [--out .device]

BUILD_DIR holds a build made for the pack (tools/ember device-pack configures
it: sm_90 only, no OpenCV, no RPATH). Copies, stripped:
  build/lib/libember.so.0 and the Debian libraries it needs that the GPU machine lacks (CARRIED_LIBS),
  build/bin/<recipes and benches>, build/tests/<test binaries>
and beside them the data (Fashion-MNIST whole, the fortunes, a small JPEG
set as WebDataset shards), the sources of a fallback build on a machine
without apt (GoogleTest, the header-only toml++ and nlohmann_json, zlib's
headers) and manifest.json (torch version, CUDA version and architectures,
commit, sizes, whether nvJPEG is carried).

Fashion-MNIST travels whole, as its gzip'd files (29.4 MiB: train images
25.2, test images 4.2): the speed run's goal (94% in under 5 s, device
check call 3) is for all 60,000 training images. With the rest as measured
on 2026-12-03 (the binaries stripped 10.7 MiB at most: that is a build for
sm_80 and sm_90, the pack's is sm_90 only; the fortunes 2.5 MiB, GoogleTest's
sources 3.3, the headers 1.6, the tree 2.7), pack and tree come to about
50 MiB, under the 56 MiB allowed (64 less 8 spare). Since then the tree grew
(4.5 MiB on 2026-12-06) and two parts came: the JPEG set of the data rows (72 images of ImageNet's pixel
size, ~1.9 MiB as shards: embertools/device_check/jpeg_set.py), made here
once per build tree (PIL and numpy, which the GPU machine lacks) and kept in
BUILD_DIR/device-jpeg/, and libnvjpeg.so.13 (5.6 MiB, the nvidia-nvjpeg
wheel's, as it comes: already stripped). With them the pack may pass the
56 MiB: then GoogleTest's sources are left out, as the first thing to go
(only a build on the GPU machine needs them: one whose torch differs from
the pack's), and the pack says so (manifest.json: left_out). Should it
still not fit, leave out the fortunes next (char_gpt's rows: the sharding
plan in call 1, gpu.toml in call 3), then the JPEG set (the two data rows
of call 3); a subset of the training images only last, as it leaves the
speed run's goal unjudged (FASHION_TRAIN).

Refuses (exit 1) when a packed binary needs a library that the GPU machine
does not have: allowed are glibc, libstdc++, libgcc_s, zlib, what the torch
wheel and its nvidia-* packages ship (read from this venv) and the libraries
the pack carries (CARRIED_LIBS), or when the pack
and the tree that travels with it would not fit the device tool's 64 MiB.
"""
import argparse
import datetime
import gzip
import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))  # the shared package, embertools
from embertools.device_check.common import BENCHES, RECIPES, TESTS  # noqa: E402 (what the check runs: the pack carries it)
from embertools.device_check import jpeg_set  # noqa: E402 (the data rows' JPEG shards, made here)
MIB = 1 << 20
TRAVEL_LIMIT = 64 * MIB      # the device tool's limit on what travels
SPARE = 8 * MIB              # kept free of it
SYSTEM_LIBS = {  # on every glibc machine
    "libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1", "ld-linux-x86-64.so.2",
    "libstdc++.so.6", "libgcc_s.so.1", "libz.so.1"}
# Debian libraries libember needs that the GPU machine lacks, carried beside
# libember.so.0 (both need only glibc and zlib): the image codecs of the
# streamed datasets' decoding (augment/decode.h).
CARRIED_LIBS = ("libjpeg.so.62", "libpng16.so.16")
# nvJPEG (augment/nvjpeg.h, data.stream.nvjpeg), loaded with dlopen: the venv's nvidia-nvjpeg wheel's copy,
# carried beside libember.so.0 when the venv has it (it needs only glibc).
NVJPEG = "libnvjpeg.so.13"
FASHION_TRAIN = 60000  # training images packed (all: the speed run's goal needs them); the test split whole
# Built for the pack, not carried: ember_shards writes the JPEG set's shards here.
PACK_TOOLS = ("ember_shards",)


def log(msg):
    print(f"[device-pack] {msg}", flush=True)


def needed(path):
    out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line]


def symbol_versions(files):
    """The newest GLIBC_ and GLIBCXX_ symbol versions the files need (what the GPU machine's must have)."""
    newest = {}
    for f in files:
        out = subprocess.run(["readelf", "-V", "--wide", str(f)], capture_output=True, text=True).stdout
        for lib, ver in re.findall(r"Name: (GLIBC|GLIBCXX)_([0-9.]+)", out):
            key = tuple(int(x) for x in ver.split("."))
            if key > newest.get(lib, ((),))[0]:
                newest[lib] = (key, f"{lib}_{ver}")
    return {lib: name for lib, (_, name) in newest.items()}


def system_library(name):
    """The file of a system library by its SONAME (ldconfig's cache)."""
    for line in subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.strip().split(" => ")
        if len(parts) == 2 and parts[0].split(" ")[0] == name and "x86-64" in parts[0]:
            return Path(parts[1]).resolve()
    raise SystemExit(f"[device-pack] error: {name} is not installed here (tools/ember setup installs it)")


def strip_copy(src, dst, keep_symbols=False):
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src, dst)
    subprocess.run(["strip", "--strip-unneeded" if keep_symbols else "--strip-all", str(dst)], check=True)


def idx_subset(src, dst, count):
    """The first `count` items of a gzip'd IDX file, as a gzip'd IDX file; the file as it is when
    that is every item (recompressing it at level 9 would save 1% of it for ~20 s)."""
    with gzip.open(src, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    if count >= n:
        shutil.copyfile(src, dst)
        return n
    dims = magic & 0xFF
    shape = struct.unpack(f">{dims}I", data[4:4 + 4 * dims])
    item = 1
    for d in shape[1:]:
        item *= d
    count = min(count, n)
    header = data[:4] + struct.pack(">I", count) + data[8:4 + 4 * dims]
    body = data[4 + 4 * dims: 4 + 4 * dims + count * item]
    with gzip.open(dst, "wb", compresslevel=9) as f:
        f.write(header + body)
    return count


def make_jpegs(folder, n, seed, long_side=500):
    """n JPEGs of the data rows' set (embertools/device_check/jpeg_set.py) in folder/class<k>/, image i of
    class i % CLASSES: long_side x 2/3..1 of it (either way up), a smooth random field of +-60 (bicubic
    from a grid of long_side/20 px) around the class's colour, JPEG QUALITY, 4:2:0 (PIL's default).
    Deterministic for a seed (numpy's PCG64, PIL's libjpeg). PIL and numpy: the venv's."""
    import numpy as np
    from PIL import Image
    rng = np.random.default_rng(seed)
    cell = max(1, long_side // 20)
    for i in range(n):
        k = i % jpeg_set.CLASSES
        short = int(rng.integers(long_side * 2 // 3, long_side + 1))
        h, w = (long_side, short) if rng.random() < 0.3 else (short, long_side)
        field = (rng.random((h // cell + 2, w // cell + 2, 3)) - 0.5) * 120 + 128
        smooth = Image.fromarray(field.astype(np.uint8)).resize((w, h), Image.BICUBIC)
        pixels = np.asarray(smooth, dtype=np.float32) - 128 + np.array(jpeg_set.class_colour(k), np.float32)
        d = Path(folder) / f"class{k}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8)).save(d / f"{i:05d}.jpg", quality=jpeg_set.QUALITY)


def make_jpeg_set(out, shards_tool, splits=jpeg_set.SPLITS, long_side=500, say=log):
    """The set's shards in `out`: per split (name, images, seed), its JPEGs made in out/images/ and
    written by `ember_shards write` (SAMPLES_PER_SHARD a shard, seed 0) as out/<name>.json and
    out/<name>-NNNNNN.tar; out/images/ removed after. Returns {name: images}."""
    out = Path(out)
    scratch = out / "images"
    shutil.rmtree(scratch, ignore_errors=True)
    counts = {}
    for split, n, seed in splits:
        make_jpegs(scratch / split, n, seed, long_side=long_side)
        r = subprocess.run([str(shards_tool), "write", str(scratch / split), str(out), "--name", split,
                            "--samples-per-shard", str(jpeg_set.SAMPLES_PER_SHARD), "--seed", "0"],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(f"[device-pack] error: {shards_tool} write {split}: exit {r.returncode}: "
                             f"{r.stderr.strip()[-400:]}")
        say(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"{split}: {n} images")
        counts[split] = n
    shutil.rmtree(scratch, ignore_errors=True)
    return counts


def jpeg_shards(build, dst):
    """The data rows' JPEG set (jpeg_set.py) into dst, as shards: made once per build tree with its
    ember_shards into BUILD/device-jpeg/<recipe tag>/, copied from there after. Returns
    {split: images, "bytes": size of the shards and manifests}."""
    tag = (f"v{jpeg_set.VERSION}-" + "-".join(f"{n}{k}s{seed}" for n, k, seed in jpeg_set.SPLITS)
           + f"-q{jpeg_set.QUALITY}-p{jpeg_set.SAMPLES_PER_SHARD}")
    cache = build / "device-jpeg" / tag
    if all((cache / f"{split}.json").is_file() for split, _, _ in jpeg_set.SPLITS):
        log(f"JPEG set: kept from {cache}")
    else:
        tool = build / "bin" / PACK_TOOLS[0]
        if not tool.is_file():
            raise SystemExit(f"[device-pack] error: {tool} is missing: the pack's build makes it "
                             "(device_pack.py --targets lists it)")
        log(f"JPEG set: making {', '.join(f'{k} {n}' for n, k, _ in jpeg_set.SPLITS)} images and their shards "
            f"in {cache} (once per build tree)")
        shutil.rmtree(cache, ignore_errors=True)
        make_jpeg_set(cache, tool, say=lambda m: log(f"  {m}"))
    shutil.copytree(cache, dst, ignore=shutil.ignore_patterns("images"))
    got = {split: jpeg_set.split_images(dst, split) for split, _, _ in jpeg_set.SPLITS}
    got["bytes"] = sum(p.stat().st_size for p in dst.rglob("*") if p.is_file())
    return got


def tree_bytes():
    """Bytes of what travels besides .device: tracked and untracked-not-ignored files."""
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    total = 0
    for f in files:
        p = ROOT / f.decode()
        if f and p.is_file() and not p.is_symlink():
            total += p.stat().st_size
    shared = ROOT / "shared"
    if shared.is_dir():
        total += sum(p.stat().st_size for p in shared.rglob("*") if p.is_file())
    return total


def torch_info(python):
    """The torch version, its CUDA version and the folders of the wheel's libraries."""
    return json.loads(subprocess.run(
        [python, "-c", "import json, os, glob, torch; d = os.path.dirname(torch.__file__); "
         "print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, "
         "'libs': [os.path.join(d, 'lib')] + glob.glob(os.path.join(os.path.dirname(d), 'nvidia', '*', 'lib'))}))"],
        capture_output=True, text=True, check=True).stdout)


def foreign_libraries(files, allowed, allow_prefixes=()):
    """{file: [needed libraries outside `allowed`]} for the ELF files given."""
    bad = {}
    for f in files:
        extra = [n for n in needed(f) if n not in allowed and not n.startswith(tuple(allow_prefixes))]
        if extra:
            bad[f] = extra
    return bad


def report_foreign(bad, root):
    for f, libs in bad.items():
        log(f"error: {Path(f).relative_to(root)} needs {', '.join(libs)}, which the GPU machine does not have")
    log("allowed: glibc, libstdc++, libgcc_s, zlib, the torch wheel's libraries (torch/lib, nvidia/*/lib) and "
        f"{', '.join(CARRIED_LIBS)} (carried); "
        "build the pack without that dependency (tools/ember device-pack configures it)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", help="the pack's build tree")
    ap.add_argument("--venv-python")
    ap.add_argument("--targets", action="store_true", help="print the CMake targets the pack needs, and stop")
    ap.add_argument("--out", default=str(ROOT / ".device"))
    ap.add_argument("--fashion", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--fortunes", default="/usr/share/games/fortunes")
    ap.add_argument("--check-needed", metavar="BUILD_DIR",
                    help="only check the needed libraries of the binaries the pack carries, in this build tree")
    ap.add_argument("--allow", action="append", default=[], metavar="PREFIX",
                    help="with --check-needed: also allow libraries whose names start so (e.g. libopencv_)")
    a = ap.parse_args()
    if a.targets:
        print(" ".join(("ember",) + RECIPES + BENCHES + TESTS + PACK_TOOLS))
        return 0
    if not a.venv_python:
        ap.error("--venv-python is required")
    info = torch_info(a.venv_python)
    wheel_libs = {f for d in info["libs"] for f in os.listdir(d)}
    allowed = SYSTEM_LIBS | wheel_libs | {"libember.so.0"} | set(CARRIED_LIBS)

    if a.check_needed:
        b = Path(a.check_needed)
        files = [b / "lib" / "libember.so"] + [b / "bin" / n for n in RECIPES + BENCHES] + [b / "tests" / n for n in TESTS]
        bad = foreign_libraries(files, allowed, a.allow)
        if bad:
            report_foreign(bad, b)
            return 1
        log(f"{len(files)} binaries of {b} need only glibc, libstdc++, libgcc_s, zlib, the torch wheel's libraries, "
            f"the pack's {', '.join(CARRIED_LIBS)}"
            + (f" and {', '.join(p + '*' for p in a.allow)}" if a.allow else ""))
        return 0
    if not a.build:
        ap.error("--build is required (or --check-needed)")
    build, out = Path(a.build), Path(a.out)

    shutil.rmtree(out, ignore_errors=True)
    (out / "build").mkdir(parents=True)
    # Binaries, stripped. libember.so.0 is the file the executables ask for
    # (its SONAME); no symbolic links in the pack.
    lib = (build / "lib" / "libember.so").resolve()
    strip_copy(lib, out / "build" / "lib" / "libember.so.0", keep_symbols=True)
    for name in CARRIED_LIBS:
        strip_copy(system_library(name), out / "build" / "lib" / name, keep_symbols=True)
    nvjpeg = next((Path(d) / NVJPEG for d in info["libs"] if (Path(d) / NVJPEG).is_file()), None)
    if nvjpeg is not None:
        shutil.copy2(nvjpeg, out / "build" / "lib" / NVJPEG)
    else:
        log(f"note: no {NVJPEG} in the venv (the nvidia-nvjpeg wheel): the nvJPEG rows will say so")
    for name in RECIPES + BENCHES:
        strip_copy(build / "bin" / name, out / "build" / "bin" / name)
    for name in TESTS:
        strip_copy(build / "tests" / name, out / "build" / "tests" / name)

    # Every packed binary must load on the GPU machine.
    bad = foreign_libraries(sorted(f for f in (out / "build").rglob("*") if f.is_file()), allowed)
    if bad:
        report_foreign(bad, out)
        return 1
    versions = symbol_versions(sorted(f for f in (out / "build").rglob("*") if f.is_file()))
    log(f"every packed binary needs only glibc, libstdc++, libgcc_s, zlib, the torch wheel's libraries and "
        f"{', '.join(CARRIED_LIBS)} (carried) "
        f"(at least {', '.join(sorted(versions.values()))})")

    # Data: Fashion-MNIST in the real format (FASHION_TRAIN training images), the fortunes' text files.
    fm = out / "data" / "fashion-mnist"
    fm.mkdir(parents=True)
    packed = {}
    for split, count in (("train", FASHION_TRAIN), ("t10k", 10 ** 9)):
        for kind in ("images-idx3", "labels-idx1"):
            packed[split] = idx_subset(Path(a.fashion) / f"{split}-{kind}-ubyte.gz", fm / f"{split}-{kind}-ubyte.gz",
                                       count)
    fo = out / "data" / "fortunes"
    fo.mkdir(parents=True)
    for f in sorted(Path(a.fortunes).iterdir()):
        if f.is_file() and "." not in f.name:
            shutil.copy2(f, fo / f.name)
    jpeg = jpeg_shards(build, out / jpeg_set.PACKED)
    log(f"JPEG set: {', '.join(f'{jpeg[n]} {n}' for n, _, _ in jpeg_set.SPLITS)} images in "
        f"{jpeg['bytes'] / MIB:.1f} MiB of shards ({out / jpeg_set.PACKED})")

    # Sources of a fallback build on a machine without apt.
    shutil.copytree("/usr/src/googletest", out / "googletest", symlinks=False)
    inc = out / "include"
    inc.mkdir()
    for d in ("toml++", "nlohmann"):
        shutil.copytree(Path("/usr/include") / d, inc / d)
    for h in ("zlib.h", "zconf.h"):
        shutil.copy2(Path("/usr/include") / h, inc / h)

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True).stdout.strip())
    cache = (build / "CMakeCache.txt").read_text()
    archs = next((l.split("=", 1)[1] for l in cache.splitlines() if l.startswith("EMBER_CUDA_ARCHITECTURES:")), "?")
    pack_bytes = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    tree = tree_bytes()
    manifest = {"torch": info["torch"], "cuda": info["cuda"], "cuda_archs": archs,
                "commit": commit + ("+changes" if dirty else ""),
                "built": datetime.datetime.now().isoformat(timespec="seconds"),
                "needs": sorted(versions.values()), "fashion_mnist_train": packed["train"],
                "jpeg_set": jpeg, "nvjpeg": nvjpeg is not None, "left_out": [], "pack_bytes": pack_bytes,
                "tree_bytes": tree}
    # Over the limit: GoogleTest's sources go first (only a build on the GPU machine needs them).
    if pack_bytes + tree > TRAVEL_LIMIT - SPARE and (out / "googletest").is_dir():
        gtest = sum(p.stat().st_size for p in (out / "googletest").rglob("*") if p.is_file())
        shutil.rmtree(out / "googletest")
        log(f"note: pack {pack_bytes / MIB:.1f} MiB + tree {tree / MIB:.1f} MiB is over the "
            f"{(TRAVEL_LIMIT - SPARE) // MIB} MiB allowed: GoogleTest's sources ({gtest / MIB:.1f} MiB) left out; "
            "a build on the GPU machine (its torch other than the pack's) then needs GoogleTest there")
        pack_bytes -= gtest
        manifest.update(pack_bytes=pack_bytes, left_out=["googletest"])
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")

    by_part = {}
    for p in out.rglob("*"):
        if p.is_file():
            part = "/".join(p.relative_to(out).parts[:2])
            by_part[part] = by_part.get(part, 0) + p.stat().st_size
    for part, size in sorted(by_part.items(), key=lambda kv: -kv[1]):
        log(f"  {size / MIB:6.1f} MiB  {part}")
    total = pack_bytes + tree
    log(f"pack {pack_bytes / MIB:.1f} MiB + tree {tree / MIB:.1f} MiB = {total / MIB:.1f} MiB of the "
        f"{TRAVEL_LIMIT // MIB} MiB that travel ({(TRAVEL_LIMIT - total) / MIB:.1f} MiB spare)")
    if total > TRAVEL_LIMIT - SPARE:
        log(f"error: over the limit less {SPARE // MIB} MiB spare (GoogleTest's sources already left out); leave out "
            "the fortunes or the JPEG set, or strip the binaries further (this script's docstring weighs them)")
        return 1
    log(f"wrote {out} for torch {info['torch']} (CUDA {info['cuda']}), sm_{archs}, from {manifest['commit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
