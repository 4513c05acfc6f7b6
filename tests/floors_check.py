#!/usr/bin/env python3
"""The floors of ARCHITECTURE.md, checked on every #include in lib/.

An area may include the areas on the floors below it and LibTorch, never one
above it or beside it, and nothing in lib/ includes recipes/, tests/ or
tools/. models/ stands beside train/ and includes core/ only. A file's area
is the folder under lib/include/ember/ or lib/src/ it is in; an include's is
the first folder of its path ("ember/<area>/..." or a private "<area>/...").

Usage: floors_check.py [REPO]   (exit 1 listing each include that breaks a floor)
"""
import pathlib
import re
import sys

# Lowest floor first; areas in one tuple share a floor.
FLOORS = [
    ("core",),
    ("augment", "data"),
    ("amp",),
    ("optim",),
    ("train",),
    ("monitor", "dist", "prune"),
    ("recipe",),
]
# Areas outside the stack, with what they may include.
BESIDE = {"models": {"core"}}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def allowed(area):
    """The areas `area` may include, itself included."""
    if area in BESIDE:
        return BESIDE[area] | {area}
    level = next(i for i, floor in enumerate(FLOORS) if area in floor)
    ok = {a for floor in FLOORS[:level] for a in floor} | {area}
    if level > FLOORS.index(("train",)):
        ok |= set(BESIDE)  # models/ stands beside train/: the floors above it may use it
    return ok


def area_of_include(path, areas):
    parts = path.split("/")
    if parts[0] == "ember" and len(parts) > 2:
        return parts[1]
    if parts[0] in areas and len(parts) > 1:
        return parts[0]
    return None  # "ember/version.h", a header beside the source, a third-party one


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    areas = {a for floor in FLOORS for a in floor} | set(BESIDE)
    found = set()
    errors = []
    for base in (root / "lib" / "include" / "ember", root / "lib" / "src"):
        for f in sorted(base.rglob("*")):
            if f.suffix not in (".h", ".cpp", ".cu", ".cuh") or not f.is_file():
                continue
            rel = f.relative_to(base).parts
            if len(rel) < 2:
                continue  # ember/ember.h (the umbrella), ember/version.h
            area = rel[0]
            if area not in areas:
                errors.append(f"{f.relative_to(root)}: area '{area}' is on no floor (add it to FLOORS and ARCHITECTURE.md)")
                continue
            found.add(area)
            for inc in INCLUDE.findall(f.read_text(encoding="utf-8")):
                if inc.split("/")[0] in ("recipes", "tests", "tools"):
                    errors.append(f"{f.relative_to(root)}: includes {inc} (lib/ never includes {inc.split('/')[0]}/)")
                    continue
                target = area_of_include(inc, areas)
                if target and target not in allowed(area):
                    errors.append(f"{f.relative_to(root)}: {area}/ includes {inc} ({target}/ is not below it)")
    missing = areas - found
    if missing:
        errors.append(f"floors name areas lib/ does not have: {', '.join(sorted(missing))}")
    for e in errors:
        print(e)
    if errors:
        return 1
    print(f"floors: every include of {len(found)} areas keeps to its floor")
    return 0


if __name__ == "__main__":
    sys.exit(main())
