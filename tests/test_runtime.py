"""Mode selection happens at import, in a fresh process each time."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import tilebook

CODE = (
    "import sys, tilebook, os; "
    "print(tilebook.get_runtime().mode, os.environ.get('TRITON_INTERPRET'), "
    "'triton' in sys.modules, tilebook.pick(gpu='big', cpu='small'))"
)


def _run(env_updates: dict[str, str | None], code: str = CODE):
    env = dict(os.environ)
    for k, v in env_updates.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_forced_cpu_sets_the_interpreter_before_triton_loads():
    # An import hook records TRITON_INTERPRET at the moment triton is first imported.
    code = (
        "import os, sys, importlib.abc\n"
        "seen = []\n"
        "import importlib.machinery\n"
        "class Spy(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name != 'triton':\n"
        "            return None\n"
        "        spec = importlib.machinery.PathFinder.find_spec(name, path)\n"
        "        real = spec.loader.exec_module\n"
        "        def exec_module(module):\n"
        "            seen.append(os.environ.get('TRITON_INTERPRET'))\n"
        "            real(module)\n"
        "        spec.loader.exec_module = exec_module\n"
        "        return spec\n"
        "sys.meta_path.insert(0, Spy())\n"
        "import tilebook\n"
        "print(tilebook.get_runtime().mode, seen)\n"
    )
    proc = _run({"TILEBOOK_MODE": "cpu", "TRITON_INTERPRET": None}, code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "['1']"]


def test_forced_cpu_picks_cpu_sizes():
    proc = _run({"TILEBOOK_MODE": "cpu"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["cpu", "1", "True", "small"]


def test_bad_mode_is_a_clear_error():
    proc = _run({"TILEBOOK_MODE": "tpu"})
    assert proc.returncode != 0
    assert "TILEBOOK_MODE='tpu' is not understood" in proc.stderr


@pytest.mark.skipif(tilebook.is_gpu(), reason="checks the failure on a machine without a GPU")
def test_forced_gpu_without_gpu_fails_loudly():
    proc = _run({"TILEBOOK_MODE": "gpu", "TRITON_INTERPRET": None})
    assert proc.returncode != 0
    assert "TILEBOOK_MODE=gpu, but no usable CUDA GPU" in proc.stderr


def test_preset_interpreter_means_cpu_mode():
    proc = _run({"TILEBOOK_MODE": None, "TRITON_INTERPRET": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split()[0] == "cpu"


def test_banner_names_the_mode():
    text = tilebook.banner()
    assert text.startswith("tilebook: GPU mode" if tilebook.is_gpu() else "tilebook: CPU mode")
    assert "triton" in text and "torch" in text
