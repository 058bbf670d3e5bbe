"""MkDocs hook: links from the docs to the repository's own files.

The pages link to the code and to the benchmark results with plain relative
paths (``../gateway/config.py``, ``../../loadtest/results/soak/soak.md``), so
the same link works when the Markdown is read on a code host. Those files lie
outside ``docs/``, which a site cannot reach, so this hook mirrors each one
the docs link to (and, from a mirrored Markdown file, each one it links to in
turn) under ``source/`` in the site:

* a Markdown file becomes a page with its own text (its relative links keep
  working, since its neighbours are mirrored beside it);
* an image is copied as it is;
* any other text file (Python, YAML, shell, ...) becomes a page showing the
  file in a code block, so a module's docstring is read where it lives.

Links are rewritten to the mirror in ``on_page_markdown``. A link to a path
that does not exist is left alone, so MkDocs reports it and ``--strict``
fails: a renamed module breaks the build, not the reader.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files, InclusionLevel
from mkdocs.structure.pages import Page

MIRROR = "source"
HIDDEN = InclusionLevel.NOT_IN_NAV
"""Mirrored files are reached through links only, never from the navigation."""
HOOKS = "docs/hooks/"
"""The hooks are code beside the pages, not pages: mirrored like any other file."""
IMAGES = {".png", ".svg", ".jpg", ".jpeg", ".gif"}
LANGUAGES = {".py": "python", ".yaml": "yaml", ".yml": "yaml", ".sh": "bash", ".toml": "toml",
             ".json": "json", ".c": "c", ".txt": "text", ".cfg": "ini", ".js": "javascript",
             ".html": "html", ".ini": "ini"}
BY_NAME = {"Makefile": "makefile", "Dockerfile": "dockerfile", "LICENSE": "text"}
# ](target) or ](target "title"), images included; not inside code spans (good enough:
# the docs do not put Markdown links in code).
LINK = re.compile(r"(\]\()([^)\s#]+)(#[^)\s]*)?((?:\s+\"[^\"]*\")?\))")
FENCE = re.compile(r"^(```|~~~)")


def _links(markdown: str) -> list[str]:
    """Link targets outside fenced code blocks."""
    out: list[str] = []
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out += [m.group(2) for m in LINK.finditer(line)]
    return out


def _external(target: str) -> bool:
    return "://" in target or target.startswith(("mailto:", "/", "data:"))


class RepoMirror:
    """Which repository files the docs reach, and where each lands in the site."""

    def __init__(self, config: MkDocsConfig) -> None:
        self.docs = Path(config["docs_dir"]).resolve()
        self.repo = self.docs.parent
        self.mirrored: dict[str, str] = {}  # repo path -> site src_uri

    def repo_path(self, page_uri: str, target: str, *, in_mirror: bool) -> str | None:
        """The repository path a link of a page points to, when it leaves ``docs/``."""
        if _external(target):
            return None
        base = posixpath.dirname(page_uri)
        if in_mirror:  # a mirrored page's links are relative to its repository path
            base = posixpath.dirname(page_uri.removeprefix(MIRROR + "/"))
            joined = posixpath.normpath(posixpath.join(base, target))
        else:
            joined = posixpath.normpath(posixpath.join("docs", base, target))
        if joined.startswith(".."):
            return None
        if joined.startswith("docs/") and not in_mirror and not joined.startswith(HOOKS):
            return None  # a link between pages: MkDocs' own
        return joined if (self.repo / joined).is_file() else None

    def site_uri(self, path: str) -> str:
        suffix = Path(path).suffix.lower()
        if suffix in IMAGES or suffix == ".md":
            return f"{MIRROR}/{path}"
        return f"{MIRROR}/{path}.md"

    def collect(self, files: Files, config: MkDocsConfig) -> None:
        queue = [(f.src_uri, (self.docs / f.src_uri).read_text(encoding="utf-8"), False)
                 for f in files.documentation_pages()]
        while queue:
            page_uri, text, in_mirror = queue.pop()
            for target in _links(text):
                path = self.repo_path(page_uri, target, in_mirror=in_mirror)
                if (path is None or path in self.mirrored
                        or (path.startswith("docs/") and not path.startswith(HOOKS))):
                    continue
                uri = self.site_uri(path)
                self.mirrored[path] = uri
                source = self.repo / path
                suffix = source.suffix.lower()
                if suffix in IMAGES:
                    files.append(File.generated(config, uri, abs_src_path=str(source),
                                                inclusion=HIDDEN))
                elif suffix == ".md":
                    content = source.read_text(encoding="utf-8")
                    files.append(File.generated(config, uri, content=content, inclusion=HIDDEN))
                    queue.append((uri, content, True))
                else:
                    files.append(File.generated(config, uri, content=_code_page(path, source),
                                                inclusion=HIDDEN))

    def rewrite(self, markdown: str, page_uri: str) -> str:
        in_mirror = page_uri.startswith(MIRROR + "/")

        def swap(match: re.Match[str]) -> str:
            path = self.repo_path(page_uri, match.group(2), in_mirror=in_mirror)
            if path is not None and path.startswith("docs/") and not path.startswith(HOOKS):
                uri = path.removeprefix("docs/")  # a mirrored file's link back to a page
            elif path is not None and path in self.mirrored:
                uri = self.mirrored[path]
            else:
                return match.group(0)
            target = posixpath.relpath(uri, posixpath.dirname(page_uri) or ".")
            return f"{match.group(1)}{target}{match.group(3) or ''}{match.group(4)}"

        out, fenced = [], False
        for line in markdown.splitlines(keepends=True):
            if FENCE.match(line.lstrip()):
                fenced = not fenced
            out.append(line if fenced else LINK.sub(swap, line))
        return "".join(out)


def _code_page(path: str, source: Path) -> str:
    language = BY_NAME.get(source.name) or LANGUAGES.get(source.suffix.lower(), "text")
    text = source.read_text(encoding="utf-8", errors="replace")
    fence = "````" if "```" in text else "```"
    return (f"# {path}\n\nThe file as it is in the repository.\n\n"
            f"{fence}{language}\n{text}\n{fence}\n")


_mirror: RepoMirror | None = None


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    global _mirror  # one build's state, rebuilt on every build (hooks are modules)
    _mirror = RepoMirror(config)
    _mirror.collect(files, config)
    return files


def on_page_markdown(markdown: str, page: Page, **_: Any) -> str:
    if _mirror is None:
        return markdown
    return _mirror.rewrite(markdown, page.file.src_uri)
