"""Shared helpers: the repository root, the `fusebox` command line to compare with, fixtures."""

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL_CNN = ROOT / "examples" / "small_cnn.relax"
CONV_X2 = ROOT / "examples" / "conv2d_relu_x2.relax"
DNNL = ROOT / "examples" / "dnnl_patterns.toml"
CPU_TOML = ROOT / "configs" / "cpu.toml"
RESNET = ROOT / "tests" / "models" / "resnet-ts"


@pytest.fixture(autouse=True)
def _in_repo_root(monkeypatch):
    # Configs name plugin libraries relative to the working directory, as for the CLI.
    monkeypatch.chdir(ROOT)


def cli_path() -> str:
    """The `fusebox` binary: $FUSEBOX_CLI, else the newer of target/{release,debug}/fusebox."""
    env = os.environ.get("FUSEBOX_CLI")
    if env:
        if not pathlib.Path(env).is_file():
            pytest.fail(f"FUSEBOX_CLI={env} is not a file")
        return env
    found = [p for p in (ROOT / "target" / "release" / "fusebox", ROOT / "target" / "debug" / "fusebox") if p.is_file()]
    if not found:
        pytest.fail("no fusebox binary to compare with: run `cargo build` or set FUSEBOX_CLI")
    return str(max(found, key=lambda p: p.stat().st_mtime))


def cli(*args, check=True) -> subprocess.CompletedProcess:
    """Runs the CLI in the repository root; with `check`, fails the test on a non-zero exit."""
    p = subprocess.run([cli_path(), *map(str, args)], cwd=ROOT, capture_output=True, text=True)
    if check and p.returncode != 0:
        pytest.fail(f"fusebox {' '.join(map(str, args))} failed ({p.returncode}):\n{p.stderr}")
    return p


def cli_error(*args) -> str:
    """The text the CLI prints after `error: ` (it must fail)."""
    p = cli(*args, check=False)
    assert p.returncode == 1, (p.returncode, p.stdout, p.stderr)
    i = p.stderr.index("error: ")
    return p.stderr[i + len("error: "):].rstrip("\n")
