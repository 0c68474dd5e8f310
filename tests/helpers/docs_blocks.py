"""The fenced code blocks of README.md and docs/*.md with their markers (the convention is
described in docs/README.md, "Code blocks"), and the small parsers tests/docs/test_docs.py checks them
with: comment stripping for excerpts, inline code spans, and the commands of shell blocks."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

MARKER = re.compile(r"^\s*<!--\s*docs:\s*(?P<body>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+)(?P<info>[^`]*)$")
KINDS = ("run", "excerpt", "output", "not-run")
RUN_SUITES = ("ci", "slow", "gpu")  # `run` alone: the test suite
SHELL = ("sh", "bash")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str
    marker: str | None  # the marker's body, None where there is none
    before: str  # the visible text between the previous block (or heading) and this one
    kind: str = ""
    args: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        path = self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path
        return f"{path}:{self.line}"

    @property
    def suite(self) -> str:
        """For `run` blocks: "" (the test suite), "ci", "slow" or "gpu"."""
        return self.args[0] if self.kind == "run" and self.args else ""

    @property
    def excerpt_of(self) -> Path | None:
        return REPO / self.args[0] if self.kind == "excerpt" and self.args else None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the marker on the line before its fence."""
    lines = path.read_text().splitlines()
    out: list[Block] = []
    i, last_end = 0, 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            if lines[i].startswith("#"):
                last_end = i + 1
            i += 1
            continue
        fence, indent = m.group("fence"), m.group("indent")
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            j += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:j]]
        mm = MARKER.match(lines[i - 1]) if i > 0 else None
        marker = mm.group("body") if mm else None
        visible = [line for line in lines[last_end:i] if not MARKER.match(line)]
        b = Block(path, i + 1, m.group("info").strip().split(" ")[0], "\n".join(body) + "\n", marker,
                  "\n".join(visible))
        if marker:
            words = marker.split(None, 1)
            b.kind = words[0].rstrip(":")
            rest = words[1] if len(words) > 1 else ""
            b.args = [rest] if b.kind == "not-run" else rest.split()
        out.append(b)
        i, last_end = j + 1, j + 1
    return out


def all_blocks() -> list[Block]:
    return [b for path in DOCS for b in blocks(path)]


# ---- excerpts --------------------------------------------------------------------------------

def strip_comment(line: str, lang: str) -> str:
    """The line without its trailing comment (`//` in C++, `#` elsewhere), outside string literals."""
    marks = ("//",) if lang in ("cpp", "c", "cuda", "h") else ("#",)
    quote = None
    k = 0
    while k < len(line):
        c = line[k]
        if quote:
            if c == "\\":
                k += 2
                continue
            if c == quote:
                quote = None
        elif c in "\"'":
            quote = c
        elif any(line.startswith(mark, k) for mark in marks):
            return line[:k]
        k += 1
    return line


def code_lines(text: str, lang: str) -> list[str]:
    """Non-blank lines without comments, whitespace collapsed. In a diff, the lines it adds."""
    out = []
    for line in text.splitlines():
        if lang == "diff":
            if not line.startswith("+") or line.startswith("+++"):
                continue
            line = line[1:]
            lang_of_line = "python"
        else:
            lang_of_line = lang
        s = " ".join(strip_comment(line, lang_of_line).split())
        if s and s != "...":
            out.append(s)
    return out


def missing_excerpt_lines(block: Block) -> list[str]:
    """The block's code lines that do not occur, in order, in the file it is an excerpt of."""
    path = block.excerpt_of
    lang = block.lang or "text"
    if lang == "diff" or path.suffix in (".py", ".tmpl"):
        file_lang = "python"
    elif path.suffix in (".cpp", ".h", ".cu", ".cuh"):
        file_lang = "cpp"
    else:
        file_lang = lang
    file_lines = [" ".join(strip_comment(line, file_lang).split()) for line in path.read_text().splitlines()]
    missing, pos = [], 0
    for want in code_lines(block.text, lang):
        try:
            pos = file_lines.index(want, pos) + 1
        except ValueError:
            missing.append(want)
    return missing


# ---- prose ----------------------------------------------------------------------------------

def code_spans(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every inline code span outside fenced blocks."""
    out = []
    in_fence = None
    text = path.read_text()
    # Spans may wrap across lines: scan the text of each paragraph-free region with line numbers.
    lines = text.splitlines()
    kept = []
    for n, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if in_fence:
            if line.strip() == in_fence:
                in_fence = None
            kept.append("")
            continue
        if m:
            in_fence = m.group("fence")
            kept.append("")
            continue
        kept.append(line)
    joined = "\n".join(kept)
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", joined):
        out.append((joined.count("\n", 0, m.start()) + 1, " ".join(m.group(1).split())))
    return out


# ---- shell commands ---------------------------------------------------------------------------

def commands(text: str) -> list[list[str]]:
    """The simple commands of a shell block (comments dropped, continuations joined, split at
    `&&`, `||`, `;` and `|`), as word lists; environment assignments in front are dropped. A
    command substitution `$(...)` is a command of its own, and the word SUBST in its place."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = strip_comment(line, "sh").strip()
        while True:
            m = re.search(r"\$\(([^()]*)\)", line)
            if not m:
                break
            out.extend(commands(m.group(1)))
            line = line[:m.start()] + "SUBST" + line[m.end():]
        if not line:
            continue
        for part in _split_operators(line):
            try:
                words = shlex.split(part)
            except ValueError:
                words = part.split()
            while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                words = words[1:]
            if words:
                out.append(words)
    return out


def _split_operators(line: str) -> list[str]:
    """The line split at `&&`, `||`, `;` and `|` outside quotes (an `asv -b '^(a|b)'` regex stays whole)."""
    parts, cur, quote, k = [], [], None, 0
    while k < len(line):
        c = line[k]
        if quote:
            quote = None if c == quote else quote
        elif c in "\"'":
            quote = c
        elif line.startswith(("&&", "||"), k):
            parts.append("".join(cur))
            cur, k = [], k + 2
            continue
        elif c in ";|":
            parts.append("".join(cur))
            cur, k = [], k + 1
            continue
        cur.append(c)
        k += 1
    parts.append("".join(cur))
    return parts
