"""`pip install .` in a fresh virtual environment gives the module and the command.

Opt-in (CRASHREPLAY_TEST_PIP_INSTALL=1): the install builds the whole
project again in Release (the libraries, the extension and the executable),
which takes many minutes on a small machine, and downloads numpy,
scikit-build-core and nanobind from PyPI. Run it after changing
pyproject.toml, python/CMakeLists.txt or the CMake layout.
"""
import os
import subprocess
import sys
import venv

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.skipif(os.environ.get("CRASHREPLAY_TEST_PIP_INSTALL") != "1",
                                reason="opt-in: CRASHREPLAY_TEST_PIP_INSTALL=1 (a full Release build)")


def test_pip_install_gives_the_module_the_executable_and_python_dash_m(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    bin_dir = env_dir / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CRASHREPLAY_BIN", "VIRTUAL_ENV")}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    r = subprocess.run([str(bin_dir / "pip"), "install", "-q", ROOT], env=env, capture_output=True, text=True,
                       timeout=3600)
    assert r.returncode == 0, r.stderr[-4000:]
    assert (bin_dir / "crashreplay").is_file()
    r = subprocess.run(["crashreplay", "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "replay" in r.stdout and "bisect" in r.stdout, r.stderr
    py = str(bin_dir / "python")
    r = subprocess.run([py, "-m", "crashreplay", "version"], env=env, capture_output=True, text=True, timeout=60,
                       cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.startswith("crashreplay "), r.stderr
    # the installed package, not the checkout, and its recorder works
    code = ("import crashreplay, sys; assert 'site-packages' in crashreplay.__file__, crashreplay.__file__; "
            "r = crashreplay.Recorder(sys.argv[1], engine='x', install_signal_handlers=False); "
            "r.record_step(0, mode='decode', token_ids=[1]); r.close(); print(r.path)")
    r = subprocess.run([py, "-c", code, str(tmp_path / "c.crcap")], env=env, capture_output=True, text=True,
                       timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["crashreplay", "info", str(tmp_path / "c.crcap")], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "1 step record" in r.stdout, r.stdout + r.stderr
