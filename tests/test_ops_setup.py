"""DeepSpeed's CPU ops set-up (``cpu_backend.ops``, ``cpu_backend.quoted_ldflags``).

A torch (and so a venv) under a path with a space still links what it builds: torch's ``cpp_extension``
writes ``-L<torch>/lib`` unquoted into ``build.ninja`` (DeepSpeed's ops), inductor's ``CppBuilder`` into
the command it runs (vLLM's compiled CPU sampler); the real builds below fail without
``quoted_ldflags`` and link with it. Set-up clears the locks of killed builds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from rpg_openrlhf.cpu_backend import quoted_ldflags

REPO = Path(__file__).resolve().parents[1]

BUILD = """
import ctypes, sys
from pathlib import Path
if sys.argv[1] == "quoted":
    from rpg_openrlhf.cpu_backend.quoted_ldflags import install
    install()
import torch.utils.cpp_extension as ce
assert " " in ce.TORCH_LIB_PATH, ce.TORCH_LIB_PATH
out = Path(sys.argv[3])
ce.load(name="answer", sources=[sys.argv[2]], build_directory=str(out), is_python_module=False)
print("answer", ctypes.CDLL(str(out / "answer.so")).rpg_answer())
"""

#: The same library built by inductor's C++ builder (what ``torch.compile`` runs on CPU), linked to torch.
BUILD_INDUCTOR = """
import ctypes, sys
from pathlib import Path
if sys.argv[1] == "quoted":
    from rpg_openrlhf.cpu_backend.quoted_ldflags import install
    install()
from torch._inductor import cpp_builder
import torch.utils.cpp_extension as ce
assert " " in ce.TORCH_LIB_PATH, ce.TORCH_LIB_PATH
options = cpp_builder.CppTorchOptions()
assert ce.TORCH_LIB_PATH in options.get_libraries_dirs(), options.get_libraries_dirs()
builder = cpp_builder.CppBuilder("answer", [sys.argv[2]], options, output_dir=sys.argv[3])
builder.build()
print("answer", ctypes.CDLL(builder.get_target_file_path()).rpg_answer())
"""


def _build(tmp_path: Path, mode: str, script: str) -> subprocess.CompletedProcess[str]:
    """Compile and link a one-function C++ library with one of torch's builders (``script``: the JIT
    one, else inductor's), torch imported from a path with a space (a link to this venv's site-packages)."""
    site = tmp_path / "site with space"
    if not site.exists():
        site.symlink_to(sysconfig.get_paths()["purelib"], target_is_directory=True)
        (tmp_path / "answer.cpp").write_text('extern "C" int rpg_answer() { return 42; }\n')
    out = tmp_path / f"build-{mode}"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    return subprocess.run(  # -S: no .pth runs (this venv's own may install the hook: a path with a space)
        [sys.executable, "-S", "-c", script, mode, str(tmp_path / "answer.cpp"), str(out)],
        env=env, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.mark.parametrize("script", [BUILD, BUILD_INDUCTOR], ids=["jit", "inductor"])
def test_a_torch_under_a_path_with_a_space_links_only_when_quoted(tmp_path: Path, script: str) -> None:
    plain = _build(tmp_path, "plain", script)
    assert plain.returncode != 0 and "-ltorch" in plain.stderr + plain.stdout, plain.stdout[-2000:]
    quoted = _build(tmp_path, "quoted", script)
    assert quoted.returncode == 0, quoted.stderr[-3000:]
    assert quoted.stdout.strip().splitlines()[-1] == "answer 42"


def test_the_start_up_line_quotes_only_where_the_venv_path_has_a_space(tmp_path: Path) -> None:
    pth = quoted_ldflags.write_pth(tmp_path)
    probe = (
        "import sys; sys.prefix = sys.argv[1]; exec(open(sys.argv[2]).read());"
        "import torch.utils.cpp_extension as ce; from torch._inductor import cpp_builder as cb;"
        "print(getattr(ce._prepare_ldflags, 'quotes_whitespace', False),"
        "      getattr(cb.CppBuilder.__init__, 'quotes_whitespace', False))"
    )
    for prefix, expected in (("/venvs/my runs/.venv", "True True"), ("/venvs/runs/.venv", "False False")):
        proc = subprocess.run(  # -S: only this line runs, not the venv's own .pth files
            [sys.executable, "-S", "-c", probe, prefix, str(pth)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join([sysconfig.get_paths()["purelib"], str(REPO)])},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip().splitlines()[-1] == expected, (prefix, proc.stdout)


def test_set_up_removes_the_locks_of_killed_builds(tmp_path: Path, monkeypatch) -> None:
    """torch waits without limit for a build's ``lock`` to go: one left by a killed build would stall
    every later load of the op (seen here with two checkouts sharing one extensions dir)."""
    from rpg_openrlhf.cpu_backend.ops import remove_stale_locks

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    (tmp_path / "fused_adam").mkdir()
    (tmp_path / "fused_adam" / "lock").touch()
    (tmp_path / "fused_adam" / "fused_adam.so").touch()
    assert remove_stale_locks() == [tmp_path / "fused_adam" / "lock"]
    assert sorted(p.name for p in (tmp_path / "fused_adam").iterdir()) == ["fused_adam.so"]
