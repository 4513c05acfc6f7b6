#!/usr/bin/env python3
"""Every link in the documentation resolves (ctest: docs.links).

    python3 tests/docs_check.py [REPO_ROOT]

Checks every Markdown file of the repository (tracked and untracked-not-ignored
when git is there, else every *.md outside build*/, .venv/, .device/, runs/ and
shared/):

1. each relative link `[text](path)` and `[text](path#anchor)` names a file or
   folder inside the repository (a link that leaves it, as `../shared/...`
   did, fails: a clone does not have it);
2. each `#anchor` (on its own or after a path) is the GitHub slug of a heading
   of the target Markdown file;
3. each code span that names a repository path (`tools/plan/plan.py`,
   `lib/include/ember/train/trainer.h`, `tests/fuzz/`: starting with one of the
   top-level folders below, no placeholder such as `<area>` or `*`) exists, so
   a moved file cannot leave a stale path in the docs;
4. each `README "<Section>"` reference, in any tracked text file (code comments,
   scripts, tests), names text the top README.md has (a heading, or the link
   text of its map to the rest of the documentation).

5. the README's driver table (rows starting with `| \`COMMAND`) lists every
   command of `tools/ember` (the patterns of its final `case`);
6. the tools' shared package, tools/embertools/: tools/README.md names each
   of its modules (`tools/embertools/NAME.py`) and subpackages
   (`tools/embertools/NAME/`), and every module of it opens with a docstring
   saying what it holds.

Links inside code blocks and code spans are not links. Exit 0 when all hold,
1 with one line per broken reference otherwise.
"""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

PATH_ROOTS = ("lib/", "tools/", "tests/", "recipes/", "cmake/", "docs/", "data/", ".ci/")
SKIP_DIRS = {".git", ".venv", ".device", "runs", "shared", "node_modules"}
LINK = re.compile(r"(?<!\!)\[([^\]]*)\]\(([^)\s]+)\)")
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
SPAN = re.compile(r"(`+)(.+?)\1", re.S)
README_REF = re.compile(r"README(?:\.md)?:? \"([^\"\n]+)\"")
TEXT_SUFFIXES = {".md", ".h", ".cpp", ".cu", ".cuh", ".py", ".sh", ".txt", ".cmake", ".toml", ""}


def check(ok, what):
    """An assert that PYTHONOPTIMIZE cannot remove: AssertionError(what) unless ok."""
    if not ok:
        raise AssertionError(what)


def repo_files(root):
    """Relative paths of the repository's files: git's list when there is one, else a walk."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], capture_output=True, check=True).stdout
        return sorted({f for f in out.decode().split("\0") if f and (root / f).is_file()})
    except (OSError, subprocess.CalledProcessError):
        files = []
        for d, dirs, names in os.walk(root):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith("build")]
            files += [str(Path(d, n).relative_to(root)) for n in names]
        return sorted(files)


def slug(heading):
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def prose(text):
    """The text outside fenced code blocks, line numbers kept (fenced lines blanked)."""
    lines, fenced = [], False
    for line in text.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            lines.append("")
        else:
            lines.append("" if fenced else line)
    return "\n".join(lines)


def anchors(path, cache={}):
    if path not in cache:
        seen, out = {}, set()
        for line in prose(path.read_text(encoding="utf-8")).split("\n"):
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = slug(m.group(1))
                n = seen.get(s, 0)
                seen[s] = n + 1
                out.add(s if n == 0 else f"{s}-{n}")
        cache[path] = out
    return cache[path]


def line_of(text, pos):
    return text.count("\n", 0, pos) + 1


def check_markdown(root, rel, errors):
    path = root / rel
    text = prose(path.read_text(encoding="utf-8"))
    spans = [(m.start(), m.end(), m.group(2)) for m in SPAN.finditer(text)]
    in_span = lambda pos: any(a <= pos < b for a, b, _ in spans)
    for regex in (LINK, IMAGE):
        for m in regex.finditer(text):
            if in_span(m.start()):
                continue
            target, where = m.group(2), f"{rel}:{line_of(text, m.start())}"
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part).resolve() if file_part else path.resolve()
            try:
                dest.relative_to(root.resolve())
            except ValueError:
                errors.append(f"{where}: link '{target}' leaves the repository")
                continue
            if not dest.exists():
                errors.append(f"{where}: link '{target}': no such file or folder")
                continue
            if anchor:
                if dest.suffix != ".md" or not dest.is_file():
                    errors.append(f"{where}: link '{target}': an anchor into a file that is not Markdown")
                elif anchor not in anchors(dest):
                    errors.append(f"{where}: link '{target}': {dest.relative_to(root.resolve())} has no heading "
                                  f"with the anchor #{anchor}")
    for start, _, span in spans:
        name = re.sub(r"\n\s*", "", span.strip())
        if not name.startswith(PATH_ROOTS) or re.search(r"[<>*{}$\s|,;()=?\[\]]|\.\.\.", name):
            continue
        if not (root / name).exists():
            errors.append(f"{rel}:{line_of(text, start)}: `{name}`: no such file or folder in the repository")


def check_readme_refs(root, files, errors):
    readme = (root / "README.md").read_text(encoding="utf-8").lower()
    for rel in files:
        if Path(rel).suffix not in TEXT_SUFFIXES or rel == "README.md":
            continue
        try:
            text = (root / rel).read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        for m in README_REF.finditer(text):
            if m.group(1).startswith("<"):  # a placeholder, as in this docstring
                continue
            if m.group(1).lower() not in readme:
                errors.append(f"{rel}:{line_of(text, m.start())}: names README \"{m.group(1)}\", which README.md "
                              "does not have (a heading, or a link text of its map)")


def check_driver_table(root, errors):
    driver = root / "tools" / "ember"
    if not driver.is_file():
        return
    commands = re.findall(r"^  ([a-z][a-z-]*)\) ", driver.read_text(encoding="utf-8"), re.M)
    check(commands, "tools/ember: no command found in its case statement (has its layout changed?)")
    rows = [line for line in (root / "README.md").read_text(encoding="utf-8").split("\n") if line.startswith("| `")]
    for c in commands:
        if not any(re.search(rf"`{re.escape(c)}[ `]", row.split("|")[1]) for row in rows):
            errors.append(f"README.md: the driver table has no row for `tools/ember {c}`")


def check_tools_package(root, files, errors):
    """Rule 6: tools/README.md names every module and subpackage of tools/embertools/, and each of
    its modules has a docstring."""
    package = "tools/embertools/"
    modules = [f for f in files if f.startswith(package) and f.endswith(".py")]
    if not modules:
        return
    readme = (root / "tools" / "README.md").read_text(encoding="utf-8")
    names = set()
    for rel in modules:
        top = rel[len(package):].split("/")
        names.add(package + (top[0] + "/" if len(top) > 1 else top[0]))
        try:
            docstring = ast.get_docstring(ast.parse((root / rel).read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError) as e:
            errors.append(f"{rel}: not readable as Python ({e})")
            continue
        if not docstring:
            errors.append(f"{rel}: no docstring (a module of the shared package says what it holds)")
    for name in sorted(names - {package + "__init__.py"}):
        if f"`{name}`" not in readme:
            errors.append(f"tools/README.md: does not name `{name}` (the shared package's map, \"The shared package\")")


def main(argv):
    root = Path(argv[1] if len(argv) > 1 else Path(__file__).resolve().parents[1]).resolve()
    check((root / "README.md").is_file(), f"{root}: no README.md (pass the repository's root)")
    files = repo_files(root)
    markdown = [f for f in files if f.endswith(".md") and not f.startswith(tuple(d + "/" for d in SKIP_DIRS))]
    errors = []
    for rel in markdown:
        check_markdown(root, rel, errors)
    check_readme_refs(root, files, errors)
    check_driver_table(root, errors)
    check_tools_package(root, files, errors)
    for e in errors:
        print(e)
    print(f"docs check: {len(markdown)} Markdown files, {len(errors)} broken reference(s)")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
