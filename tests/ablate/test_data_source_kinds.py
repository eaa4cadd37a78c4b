"""A `data.source` that exists but is no file or folder (a device, a FIFO, a socket) is refused in one line,
before anything opens it: reading /dev/zero never ends, and a FIFO with no writer blocks its reader."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from cli_helpers import assert_one_line_error, run_cli

from ablate.core.errors import UserError
from ablate.data.config import DataConfig


def test_dev_zero_as_source_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the recipes/ of this checkout
    code, _, err = run_cli(
        capsys, "sweep", "recipes/table6.yaml", "--scale", "tiny", "--yes", "--workspace", tmp_path / "ws",
        "--base.data.source", "/dev/zero",
    )  # fmt: skip
    assert_one_line_error(code, err, "data.source: /dev/zero is a character device", "'stdlib'")
    assert not (tmp_path / "ws").exists()  # refused before the sweep made its workspace


def test_fifo_and_socket_sources_are_refused_without_opening_them(tmp_path):
    fifo = tmp_path / "corpus.txt"
    os.mkfifo(fifo)  # opening it for reading would block: the check must only stat it
    with pytest.raises(
        UserError, match=r"data.source: .*corpus.txt is a FIFO \(named pipe\), not a file or folder"
    ):
        DataConfig(source=str(fifo))
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(tmp_path / "s.sock"))
        with pytest.raises(UserError, match=r"s.sock is a socket, not a file or folder"):
            DataConfig(source=str(tmp_path / "s.sock"))


def test_regular_files_folders_and_absent_paths_still_pass(tmp_path):
    (tmp_path / "a.txt").write_text("text")
    assert DataConfig(source=str(tmp_path / "a.txt")).source.endswith("a.txt")
    assert DataConfig(source=str(tmp_path)).source == str(tmp_path)
    assert DataConfig(source="org/not-here-a-hub-id").source == "org/not-here-a-hub-id"  # checked when read
