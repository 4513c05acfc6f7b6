#!/usr/bin/env python3
"""The floors of ARCHITECTURE.md, checked on every #include in lib/.

An area may include the areas on the floors below it and LibTorch, never one
above it or beside it, and nothing in lib/ includes recipes/, tests/ or
tools/. models/ stands beside train/ and includes core/ only. A file's area
is the folder under lib/include/ember/ or lib/src/ it is in; an include's is
the first folder of its path ("ember/<area>/..." or a private "<area>/...").

The Python tools' shared package, tools/embertools/, has floors of its own,
checked on every import of its modules: a shared module (embertools/*.py)
imports the standard library and other shared modules only, never a tool's
part; a tool's part (embertools/TOOL/) imports the shared modules and its own
TOOL's parts, never another tool's; only tune/ may import a package outside
the standard library (optuna, and torch where a driver lacks nvidia-smi; the others run with a bare python3: the doctor
on a bare node, the GPU check on the lent machine). And no Python file in
tools/ is over 1,000 lines (a larger one is split along its sections into a
subpackage).

Usage: floors_check.py [REPO]   (exit 1 listing each include or import that breaks a floor)
"""
import ast
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


PACKAGE = "embertools"
THIRD_PARTY_OK = {"tune": {"optuna", "sqlalchemy", "matplotlib", "numpy", "torch"}}  # beyond the stdlib
MAX_TOOL_LINES = 1000


def imported(tree, part):
    """(line, absolute module name) of each import in a module of package `part` ("embertools" or
    "embertools.TOOL"); a relative import is resolved against it."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = part.split(".")[:len(part.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
                names = [module] if node.module else [f"{module}.{a.name}" for a in node.names]
                for name in names:
                    yield node.lineno, name
            else:
                yield node.lineno, node.module
                if node.module == PACKAGE:  # from embertools import runs
                    for alias in node.names:
                        yield node.lineno, f"{PACKAGE}.{alias.name}"


def python_floors(root):
    """The floors of tools/embertools/ and the size of tools/'s Python files: [error lines], parts seen."""
    errors, parts = [], set()
    tools = root / "tools"
    stdlib = set(sys.stdlib_module_names)
    for f in sorted(tools.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        lines = f.read_text(encoding="utf-8").count("\n")
        if lines > MAX_TOOL_LINES:
            errors.append(f"{f.relative_to(root)}: {lines} lines, over {MAX_TOOL_LINES}: split it along its "
                          f"sections (a subpackage of tools/{PACKAGE}/, as plan, tune, doctor and device_check)")
    base = tools / PACKAGE
    if not base.is_dir():
        return errors, parts
    for f in sorted(base.rglob("*.py")):
        if "__pycache__" in f.parts:
            continue
        rel = f.relative_to(base).parts
        tool = rel[0] if len(rel) > 1 else None  # None: a shared module
        parts.add(tool or "(shared)")
        part = PACKAGE + (f".{tool}" if tool else "")
        where = f.relative_to(root)
        for line, name in imported(ast.parse(f.read_text(encoding="utf-8")), part):
            top = name.split(".")[0]
            if top == PACKAGE:
                inner = name.split(".")[1:]
                if not inner:
                    continue
                target = inner[0] if (base / inner[0]).is_dir() else None
                if target is not None and target != tool:
                    what = "a shared module" if tool is None else f"{tool}/"
                    errors.append(f"{where}:{line}: {what} imports {name} ({target}/ is another tool's part; "
                                  f"what two tools share goes in a shared module)")
            elif top not in stdlib and top not in THIRD_PARTY_OK.get(tool, ()):
                errors.append(f"{where}:{line}: imports {name}, outside the standard library ({PACKAGE}/"
                              f"{tool + '/' if tool else ''} runs with a bare python3; only tune/ may import "
                              f"{', '.join(sorted(THIRD_PARTY_OK['tune']))})")
    return errors, parts


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
            text = f.read_text(encoding="utf-8")
            # A file that tests EMBER_WITH_CUDA_KERNELS includes the header that defines it: -Wundef
            # catches one that does not in a file compiled alone, not in a unity batch (the batch's
            # earlier files may have included it), where the test silently reads 0.
            if re.search(r"^\s*#\s*(el)?if.*\bEMBER_WITH_CUDA_KERNELS\b", text, re.M) and \
                    '"ember/version.h"' not in text:
                errors.append(f"{f.relative_to(root)}: tests EMBER_WITH_CUDA_KERNELS without including "
                              f"\"ember/version.h\" (which defines it)")
            for inc in INCLUDE.findall(text):
                if inc.split("/")[0] in ("recipes", "tests", "tools"):
                    errors.append(f"{f.relative_to(root)}: includes {inc} (lib/ never includes {inc.split('/')[0]}/)")
                    continue
                target = area_of_include(inc, areas)
                if target and target not in allowed(area):
                    errors.append(f"{f.relative_to(root)}: {area}/ includes {inc} ({target}/ is not below it)")
    missing = areas - found
    if missing:
        errors.append(f"floors name areas lib/ does not have: {', '.join(sorted(missing))}")
    py_errors, parts = python_floors(root)
    errors += py_errors
    for e in errors:
        print(e)
    if errors:
        return 1
    print(f"floors: every include of {len(found)} areas keeps to its floor")
    print(f"floors: every import of tools/{PACKAGE}/ ({len(parts)} parts) keeps to its floor; no Python file "
          f"in tools/ over {MAX_TOOL_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
