"""`ablate ui` serves the workspace's MLflow store on 127.0.0.1 (a real server, a real HTTP request)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

from ablate import tracking
from ablate.launch import free_port


def test_ui_serves_the_workspace_store_on_loopback(tmp_path):
    workspace = tmp_path / "ws"
    client = tracking.client_for(workspace, None)
    tracking.get_experiment_id(client, "ui-test", workspace)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "ablate.cli", "ui", "--workspace", str(workspace), "--port",
                             str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        first_line = proc.stdout.readline()
        assert f"http://127.0.0.1:{port}" in first_line
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/experiments/get-by-name?experiment_name=ui-test"
        deadline, body = time.time() + 90, None
        while time.time() < deadline and body is None:
            assert proc.poll() is None, proc.stdout.read()
            try:
                body = urllib.request.urlopen(url, timeout=2).read().decode()
            except OSError:
                time.sleep(0.5)
        assert body is not None and "ui-test" in body
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
