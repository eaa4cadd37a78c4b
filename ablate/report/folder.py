"""A report folder written as a whole: a reader (or a kill, or a full disk) sees the old folder or the new
one, never a mix.

`writing(folder)` copies the folder as it is into a hidden sibling, hands the sibling to the writer, and
when the writer is done exchanges the two folders in one `renameat2(RENAME_EXCHANGE)` call (Linux), then
removes the old one. Why a copy and not an empty sibling: a folder holds files a report does not write
(its export when rebuilt `--from` it, a prediction, a person's notes), and those must survive. Where the
kernel or the file system has no exchange, two renames are used and the old folder is kept beside until the
new one is in place, so the next writer puts it back if the process died between them.

A link inside a report folder is refused: git keeps links, and writing through one would write outside
the folder. So is a link among the siblings a killed writer leaves (`.NAME.old-PID`, `.NAME.writing-PID`),
which a recovery would otherwise rename into place: every path is checked when it is used (the folder
after the recovery, the copy read through a descriptor opened without following a link, the renamed
folder after its rename), not once before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from ablate.core.errors import UserError
from ablate.core.processes import pid_alive

WRITING = ".writing-"  # `.NAME.writing-PID`: the new folder while it is written
OLD = ".old-"  # `.NAME.old-PID`: the old folder between two renames (no exchange available)
RENAME_EXCHANGE = 2
AT_FDCWD = -100


def refuse_links(folder: Path, flag: str = "report folder") -> None:
    """One line when `folder`, or anything inside it, is a symbolic link."""
    folder = Path(folder)
    if folder.is_symlink():
        raise UserError(
            f"{flag}: {folder} is a link; a report folder is written only inside itself: give a real folder"
        )
    if not folder.is_dir():
        return
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            raise UserError(
                f"{flag}: {path} is a link (to {os.readlink(path)}); a report is written only inside its "
                "folder: replace the link by the file or remove it"
            )


@contextlib.contextmanager
def writing(folder: Path, flag: str = "report folder") -> Iterator[Path]:
    """Yield a sibling of `folder` holding a copy of it; swap it in as `folder` when the block ends without
    an exception, else remove it (the old folder stays as it was)."""
    folder = Path(folder).absolute()
    refuse_links(folder, flag)
    recover(folder, flag)
    refuse_links(folder, flag)  # what the recovery put in place, checked again
    folder.parent.mkdir(parents=True, exist_ok=True)
    new = folder.parent / f".{folder.name}{WRITING}{os.getpid()}"
    _refuse_link(new, flag)
    shutil.rmtree(new, ignore_errors=True)
    try:
        if folder.is_dir():
            _copy(folder, new, flag)
        else:
            new.mkdir()
        yield new
        _swap(new, folder)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(
                f"{flag}: the disk holding {folder.parent} is full ({e.strerror}); {folder} is left as it "
                "was: free some space and write the report again"
            ) from None
        raise
    finally:
        shutil.rmtree(new, ignore_errors=True)


def recover(folder: Path, flag: str = "report folder") -> None:
    """Undo what a killed writer left beside `folder`: an old folder between two renames comes back when
    `folder` is missing; a sibling being written by a process that is gone is removed. A sibling that is a
    link (no writer leaves one) is one line: it is neither renamed into place nor removed."""
    for sibling in sorted(folder.parent.glob(f".{folder.name}.*")) if folder.parent.is_dir() else []:
        kind, _, pid = sibling.name[len(folder.name) + 1 :].rpartition("-")
        if f"{kind}-" not in (WRITING, OLD) or not pid.isdigit() or _alive(int(pid)):
            continue
        _refuse_link(sibling, flag)
        if f"{kind}-" == OLD and not os.path.lexists(folder):
            os.rename(sibling, folder)
            if folder.is_symlink():  # made a link between the check and the rename: put back, refused
                os.rename(folder, sibling)
                _refuse_link(sibling, flag)
        else:
            shutil.rmtree(sibling, ignore_errors=True)  # rmtree never follows a link


def _refuse_link(path: Path, flag: str) -> None:
    """One line when `path` is a link (its target is never read, renamed or removed)."""
    if path.is_symlink():
        raise UserError(
            f"{flag}: {path} is a link (to {os.readlink(path)}); a report folder and what a killed writer "
            "leaves beside it are folders: remove the link (rm, not rm -r) and write the report again"
        )


def _copy(folder: Path, new: Path, flag: str) -> None:
    """`folder` copied to `new` through a descriptor opened without following a link (so a link put at its
    name after the checks is refused, not copied from), and the copy checked for links."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):
            refuse_links(folder, flag)
        raise
    try:
        source = f"/proc/self/fd/{fd}" if os.path.isdir("/proc/self/fd") else str(folder)
        shutil.copytree(source, new, symlinks=True)
    finally:
        os.close(fd)
    refuse_links(new, flag)


def _alive(pid: int) -> bool:
    """A writer's pid that is not this process's and still runs (its sibling folder is not a leftover)."""
    return pid != os.getpid() and pid_alive(pid)


def _swap(new: Path, folder: Path) -> None:
    """`new` becomes `folder` in one step; the old folder ends at `new`'s name (then removed)."""
    if not folder.exists():
        os.rename(new, folder)
        return
    if _exchange(new, folder):
        return
    old = folder.parent / f".{folder.name}{OLD}{os.getpid()}"
    os.rename(folder, old)
    os.rename(new, folder)
    os.rename(old, new)  # removed by the caller's cleanup


def _exchange(a: Path, b: Path) -> bool:
    """renameat2(RENAME_EXCHANGE); False where the system has none (then the caller renames twice)."""
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def moved(paths: list[Path], new: Path, folder: Path) -> list[Path]:
    """Paths written under `new` as they are named once it is `folder`."""
    new = Path(new).absolute()
    out = []
    for path in paths:
        inside = Path(path).absolute().is_relative_to(new)
        out.append(Path(folder) / Path(path).absolute().relative_to(new) if inside else Path(path))
    return out


def hand_written(old: str, generated: str) -> str:
    """What a person wrote below the generated part of a README, kept when the report is written again.

    The rule: a person's text starts at the first heading (`#`, `##`, ... any level), after the title line,
    that the generator does not write itself (`generated`: the new generated part, whose headings are the
    generator's). So notes under `## My reading` are kept as surely as under `# What the table shows`."""
    ours = {line.rstrip() for line in generated.splitlines()[1:] if _heading(line)}
    lines = old.splitlines(keepends=True)
    for i, line in enumerate(lines[1:], start=1):
        if _heading(line) and line.rstrip() not in ours:
            return "".join(lines[i:])
    return ""


def kept_text(readme: Path, generated: str) -> str:
    """`hand_written` of the README `readme` (none where there is no README yet), read as UTF-8 text
    (ablate.core.fields): one that is not is one line, and the folder is left as it was (`writing`)."""
    from ablate.core.fields import text_file

    if not readme.exists():
        return ""
    hint = "what a person wrote below its generated part is kept when a report is written again: fix its text"
    copy = readme.parent.name  # `.NAME.writing-PID` (`writing`): the message names the folder's own README
    shown = readme.parent.parent / copy[1 : copy.rindex(WRITING)] / readme.name if WRITING in copy else readme
    return hand_written(text_file(readme, "README.md", hint, shown), generated)


def _heading(line: str) -> bool:
    hashes = len(line) - len(line.lstrip("#"))
    return 1 <= hashes <= 6 and line[hashes : hashes + 1] == " "
