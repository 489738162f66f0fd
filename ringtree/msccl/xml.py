"""Reading MSCCL-IR text as the executors read it.

MSCCL's executors (NCCL's MSCCL executor and RCCL, ``src/misc/msccl/msccl_parser.cc``)
parse algorithm files with a small hand-written reader taken from NCCL's topology XML
parser, not with an XML library, and it is stricter than XML: no ``<?xml …?>``
declaration (read as an element, it fails at ``?``), every attribute of an element on the
tag's one line, single spaces between attributes, values in double quotes, only spaces,
newlines and carriage returns between elements (a tab fails), at most 16 attributes and
1,024 children per element, ``<!-- … -->`` comments allowed.

:func:`parse` reads any well-formed file of this shape (so that files other producers
wrote can be imported) and reports, as :class:`Finding` s with the line, each place where
the executors' reader would stop. What is not even XML of this shape raises
:class:`MscclSyntaxError` with the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_ATTRIBUTES = 16
MAX_CHILDREN = 1024

_NAME = re.compile(r"[A-Za-z_][\w.-]*")
_ATTR = re.compile(r'([A-Za-z_][\w.-]*)(\s*)=(\s*)(?:"([^"]*)"|\'([^\']*)\')')
# a tag as every executor's reader wants it: one space before each key="value"
_PLAIN = re.compile(r'([A-Za-z_][\w.-]*)((?: [A-Za-z_][\w.-]*="[^"\n\t]*")*) ?(/?)')
_PAIR = re.compile(r' ([A-Za-z_][\w.-]*)="([^"]*)"')


class MscclSyntaxError(ValueError):
    """The text is not an MSCCL-IR element tree (the message names file and line)."""


@dataclass(frozen=True)
class Finding:
    """Something an MSCCL executor would reject, or that makes the algorithm wrong.

    ``level``: ``"error"`` (the algorithm cannot be imported or is wrong) or
    ``"executor"`` (it imports, but NCCL's MSCCL executor or RCCL would refuse the file:
    :func:`ringtree.msccl.read` turns these into errors with ``strict=True``).
    ``where``: file and line, then gpu / thread block / step where they apply."""

    level: str
    where: str
    what: str

    def __str__(self) -> str:
        return f"{self.where}: {self.what}"


@dataclass
class Node:
    """An element: its name, attributes in file order, line, children."""

    name: str
    attrs: dict[str, str]
    line: int
    children: list[Node] = field(default_factory=list)


def parse(text: str, path: str = "<text>") -> tuple[Node, list[Finding]]:
    """The root element of ``text`` and the places the executors' reader would stop at."""
    return _Parser(text, path).run()


class _Parser:
    """One pass over the text: the gap before each ``<``, then a comment or a tag."""

    def __init__(self, text: str, path: str) -> None:
        self.text, self.path = text, path
        self.pos, self.line = 0, 1
        self.stack: list[Node] = []
        self.root: Node | None = None
        self.findings: list[Finding] = []

    def fail(self, line: int, what: str) -> MscclSyntaxError:
        return MscclSyntaxError(f"{self.path}:{line}: {what}")

    def note(self, line: int, what: str) -> None:
        self.findings.append(Finding("executor", f"{self.path}:{line}", what))

    def run(self) -> tuple[Node, list[Finding]]:
        text = self.text
        while self.pos < len(text):
            lt = text.find("<", self.pos)
            self.gap(text[self.pos:] if lt < 0 else text[self.pos:lt])
            if lt < 0:
                break
            if text.startswith("<!--", lt):
                end = text.find("-->", lt)
                if end < 0:
                    raise self.fail(self.line, "a comment that never ends")
                self.line += text.count("\n", lt, end)
                self.pos = end + 3
            else:
                self.tag(lt)
        if self.stack:
            top = self.stack[-1]
            raise MscclSyntaxError(f"{self.path}: <{top.name}> (line {top.line}) is never "
                                   "closed")
        if self.root is None:
            raise MscclSyntaxError(f"{self.path}: no element")
        return self.root, self.findings

    def gap(self, gap: str) -> None:
        """What lies between two elements: white space, and no tab."""
        if gap.strip():
            raise self.fail(self.line, f"text between elements: {gap.strip()[:40]!r}")
        if "\t" in gap:
            self.note(self.line + gap[:gap.index("\t")].count("\n"),
                      "a tab between elements (the executors' reader accepts only spaces and "
                      "newlines there)")
        self.line += gap.count("\n")

    def tag(self, lt: int) -> None:
        end = self.text.find(">", lt)
        if end < 0:
            raise self.fail(self.line, "a tag that never ends")
        tag, at = self.text[lt + 1:end], self.line
        self.line += tag.count("\n")
        self.pos = end + 1
        if tag.startswith("?"):
            self.note(at, "an XML declaration (the executors' reader fails at '?': write none)")
        elif tag.startswith("/"):
            self.close(tag[1:].strip(), at)
        else:
            self.open(tag, at)

    def close(self, name: str, at: int) -> None:
        stack = self.stack
        if not stack or stack[-1].name != name:
            raise self.fail(at, f"</{name}> closes "
                                f"{'<' + stack[-1].name + '>' if stack else 'nothing'}")
        stack.pop()

    def open(self, tag: str, at: int) -> None:
        node, empty = _element(tag, at, self.path, self.note)
        if self.stack:
            parent = self.stack[-1]
            parent.children.append(node)
            if len(parent.children) == MAX_CHILDREN + 1:
                self.note(at, f"<{parent.name}> (line {parent.line}) has more than "
                              f"{MAX_CHILDREN} children (the executors' limit)")
        elif self.root is None:
            self.root = node
        else:
            raise self.fail(at, f"a second root element <{node.name}>")
        if not empty:
            self.stack.append(node)


def _element(tag: str, line: int, path: str, note) -> tuple[Node, bool]:
    """One start tag's name and attributes, noting what the executors' reader refuses."""
    m = _PLAIN.fullmatch(tag)
    if m is not None:  # the common case, at once
        pairs = _PAIR.findall(m.group(2))
        attrs = dict(pairs)
        if len(attrs) == len(pairs) and len(attrs) <= MAX_ATTRIBUTES:
            return Node(m.group(1), attrs, line), bool(m.group(3))
    empty = tag.endswith("/")
    body = tag[:-1] if empty else tag
    m = _NAME.match(body)
    if m is None:
        raise MscclSyntaxError(f"{path}:{line}: a tag with no element name: <{tag[:40]}>")
    name, rest = m.group(), body[m.end():]
    if "\n" in tag:
        note(line, f"<{name}> spans several lines (the executors' reader needs a tag on one "
                   "line)")
    attrs: dict[str, str] = {}
    i = 0
    while i < len(rest):
        space = len(rest) - i - len(rest[i:].lstrip())
        before = rest[i:i + space]
        i += space
        if i >= len(rest):
            break
        a = _ATTR.match(rest, i)
        if a is None:
            raise MscclSyntaxError(f"{path}:{line}: <{name}>: cannot read attributes at "
                                   f"{rest[i:i + 30]!r}")
        key = a.group(1)
        if key in attrs:
            raise MscclSyntaxError(f"{path}:{line}: <{name}>: attribute {key!r} given twice")
        attrs[key] = a.group(4) if a.group(4) is not None else a.group(5)
        if "\t" in before:
            note(line, f"<{name}>: a tab before attribute {key!r} (the executors' reader "
                       "separates attributes by single spaces)")
        elif a.group(5) is not None or a.group(2) or a.group(3) or space != 1:
            note(line, f"<{name}> attribute {key!r}: the executors' reader needs one space "
                       "before it and key=\"value\" with double quotes")
        i = a.end()
    if len(attrs) > MAX_ATTRIBUTES:
        note(line, f"<{name}> has {len(attrs)} attributes (the executors read at most "
                   f"{MAX_ATTRIBUTES})")
    return Node(name, attrs, line), empty
