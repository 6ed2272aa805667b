#!/usr/bin/env python3
"""The measured structure of the product code, for docs/architecture.md ("Structure, measured").

Counts over the product folders (tests, benchmarks, examples and scripts left out):
  - files and lines per folder;
  - functions (free functions and methods with a body; lambdas count inside their function)
    and those over 80 and over 150 lines, with the longest;
  - files over 600 lines;
  - folder arrows: folder A -> B when a file of A has `#include "B/..."`, and the cycles they make.

  scripts/structure.py              print the markdown block
  scripts/structure.py --check DOC  exit 1 (saying what differs) when DOC's block between
                                    "<!-- structure:begin -->" and "<!-- structure:end -->"
                                    names other functions over 150 lines, other files over 600
                                    lines, other folder arrows or cycles than the code has now
                                    (the counts themselves may drift between regenerations)
  scripts/structure.py --write DOC  replace that block in DOC

Function bodies are found with a small C++ scanner (comments, strings and preprocessor lines
stripped, braces matched): a "{" opened in a namespace, class or file scope right after a
parameter list (and qualifiers, an initialiser list or a trailing return type) starts a
function; if/for/while/switch/catch are never functions. Good enough to count; not a parser."""
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ["base", "kernels", "model", "formats", "optimizer", "scheduler", "trace", "data", "dist", "actors", "tier",
           "trainer", "cli", "include", "python"]
EXTS = (".cpp", ".hpp", ".cu", ".cuh", ".h")
BEGIN, END = "<!-- structure:begin -->", "<!-- structure:end -->"
CONTROL = {"if", "for", "while", "switch", "catch", "do", "else", "return", "sizeof", "decltype", "alignas"}


def product_files():
    for folder in FOLDERS:
        base = os.path.join(ROOT, folder)
        for dirpath, _, names in os.walk(base):
            for n in sorted(names):
                if n.endswith(EXTS):
                    yield folder, os.path.relpath(os.path.join(dirpath, n), ROOT)


def strip(text):
    """Text with comments, string and char literals and preprocessor lines blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == 'R' and text.startswith('R"', i):
            m = re.match(r'R"([^(\s]*)\(', text[i:])
            if m:
                close = ")" + m.group(1) + '"'
                j = text.find(close, i)
                j = n if j < 0 else j + len(close)
                out.append('""' + "\n" * text.count("\n", i, j))
                i = j
            else:
                out.append(c)
                i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        elif c == "#" and (i == 0 or text[i - 1] == "\n"):
            j = i
            while True:  # a preprocessor line, with its continuations
                k = text.find("\n", j)
                if k < 0:
                    j = n
                    break
                if text[k - 1] != "\\":
                    j = k
                    break
                j = k + 1
            out.append("\n" * text.count("\n", i, j))
            i = j
        else:
            out.append(c)
            i += 1
    return "".join(out)


def function_name(head):
    """The name before the parameter list: the first "(" outside template brackets."""
    m = re.search(r"\boperator\s*(\(\)|[^\s(]+)\s*\(", head)
    if m:
        return "operator" + m.group(1)
    angle = 0
    for i, c in enumerate(head):
        if c == "<":
            angle += 1
        elif c == ">" and head[i - 1] != "-":
            angle = max(0, angle - 1)
        elif c == "(" and angle == 0:
            m = re.search(r"([~A-Za-z_][\w:~]*)\s*$", head[:i])
            return m.group(1) if m else "?"
    return "?"


def functions(path):
    """(name, first line, lines) of every function body in the file."""
    text = strip(open(os.path.join(ROOT, path), encoding="utf-8", errors="replace").read())
    found, stack, start, line, paren = [], [], 0, 1, 0
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
        elif c == "(":
            paren += 1
        elif c == ")":
            paren = max(0, paren - 1)
        elif paren > 0:
            continue  # braces in a parameter list (a default `= {}`) open no scope
        elif c in ";":
            start = i + 1
        elif c == "{":
            head = " ".join(text[start:i].split())
            kind = "other"
            if not stack or stack[-1][0] in ("namespace", "class"):
                if re.search(r"\b(namespace)\b[^()]*$", head) or head.startswith("extern"):
                    kind = "namespace"
                elif re.search(r"\b(class|struct|union|enum)\b[^()]*$", head):
                    kind = "class"
                elif "(" in head:
                    word = re.match(r"\s*([A-Za-z_]\w*)", head)
                    if not (word and word.group(1) in CONTROL) and not head.rstrip().endswith("="):
                        head = re.sub(r"\b(__launch_bounds__|__align__|alignas|__attribute__)\s*\([^()]*\)", "", head)
                        kind = "function"
                        stack.append((kind, function_name(head), line))
                        start = i + 1
                        continue
            stack.append((kind, None, line))
            start = i + 1
        elif c == "}":
            if stack:
                kind, name, first = stack.pop()
                if kind == "function":
                    found.append((name, first, line - first + 1))
            start = i + 1
    return found


def measure():
    files, lines, funcs, big_files, arrows = {}, {}, [], [], {}
    for folder, path in product_files():
        text = open(os.path.join(ROOT, path), encoding="utf-8", errors="replace").read()
        n = text.count("\n")
        files[folder] = files.get(folder, 0) + 1
        lines[folder] = lines.get(folder, 0) + n
        if n > 600:
            big_files.append((path, n))
        for name, first, length in functions(path):
            funcs.append((length, f"{path}:{first}", name.split("::")[-1]))
        for inc in re.findall(r'^#include "([^"/]+)/', text, re.M):
            if inc != folder and inc in FOLDERS:
                arrows.setdefault(folder, set()).add(inc)
    return files, lines, funcs, sorted(big_files), arrows


def cycles(arrows):
    found = set()
    for a, outs in arrows.items():
        for b in outs:
            if a in arrows.get(b, ()):
                found.add(tuple(sorted((a, b))))
    # longer cycles: a path back to the start through other folders
    def reach(src, dst, seen):
        for nxt in arrows.get(src, ()):
            if nxt == dst:
                return True
            if nxt not in seen and reach(nxt, dst, seen | {nxt}):
                return True
        return False
    longer = sorted(a for a in arrows if reach(a, a, {a}) and not any(a in c for c in found))
    return sorted(found), longer


def block():
    files, lines, funcs, big_files, arrows = measure()
    over80 = [f for f in funcs if f[0] > 80]
    over150 = sorted((f for f in funcs if f[0] > 150), reverse=True)
    two, longer = cycles(arrows)
    out = [BEGIN,
           "Measured by `scripts/structure.py` (`--write docs/architecture.md` regenerates this block; the "
           "test `docs_structure` fails when a name or an arrow in it is no longer true).",
           "",
           "| measure | now |",
           "|---|---|",
           f"| product files (lines) | {sum(files.values())} ({sum(lines.values()):,}) |",
           f"| functions with a body | {len(funcs):,} |",
           f"| of them over 80 / over 150 lines | {len(over80)} / {len(over150)} |",
           "| over 150 lines | " + ", ".join(f"`{n}` {l} ({p.split(':')[0]})" for l, p, n in over150) + " |",
           "| files over 600 lines | " + (", ".join(f"{p} ({n})" for p, n in big_files) or "none") + " |",
           "| folder cycles | " + (", ".join(f"{a} <-> {b}" for a, b in two) +
                                   (f"; longer through {', '.join(longer)}" if longer else "") or "none") + " |",
           "",
           "Per folder (files, lines) and the folders each includes:",
           ""]
    for folder in FOLDERS:
        if folder in files:
            to = ", ".join(sorted(arrows.get(folder, ()))) or "nothing"
            out.append(f"- {folder}: {files[folder]} files ({lines[folder]:,} lines) -> {to}")
    out.append(END)
    return "\n".join(out)


def stable(text):
    """The block without its numbers: what --check compares."""
    return [re.sub(r"\d[\d,]*", "", line) for line in text.splitlines()]


def split(doc):
    text = open(doc, encoding="utf-8").read()
    b, e = text.find(BEGIN), text.find(END)
    if b < 0 or e < b:
        sys.exit(f"{doc}: no block between '{BEGIN}' and '{END}'")
    return text[:b], text[b:e + len(END)], text[e + len(END):]


def main(argv):
    if len(argv) == 1:
        print(block())
    elif len(argv) == 3 and argv[1] in ("--check", "--write"):
        before, old, after = split(argv[2])
        new = block()
        if argv[1] == "--write":
            with open(argv[2], "w", encoding="utf-8") as f:
                f.write(before + new + after)
        elif stable(old) != stable(new):
            import difflib
            diff = difflib.unified_diff(stable(old), stable(new), "documented", "measured", lineterm="", n=0)
            sys.exit(f"{argv[2]}: the measured structure changed (scripts/structure.py --write {argv[2]}):\n" +
                     "\n".join(list(diff)[2:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
