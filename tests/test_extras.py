"""A front end or command whose framework is missing names the extra to install."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from posenc._extras import missing


def run_without(modules: list[str], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter where importing ``modules`` fails."""
    blocker = "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in modules)
    return subprocess.run(
        [sys.executable, "-c", blocker + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("module", "front_end", "hint"),
    [
        ("torch", "posenc.torch", "pip install 'posenc[torch]'"),
        ("keras", "posenc.keras", "pip install 'posenc[tf]' (TensorFlow) or 'posenc[jax]' (JAX)"),
        ("jax", "posenc.jax", "pip install 'posenc[jax]'"),
    ],
)
def test_importing_a_front_end_without_its_framework(module, front_end, hint):
    result = run_without(
        [module],
        f"""
        try:
            import {front_end}
        except ImportError as exc:
            print(type(exc).__name__, exc)
        """,
    )
    assert result.returncode == 0, result.stderr
    name = {"torch": "PyTorch", "keras": "Keras 3 with a backend", "jax": "JAX"}[module]
    assert result.stdout.strip() == f"ImportError {front_end} needs {name}: {hint}"


def test_core_works_without_any_framework():
    result = run_without(
        ["torch", "keras", "jax", "tensorflow", "matplotlib"],
        "import posenc; print(posenc.sinusoidal(2, 2, dtype='float64').tolist())",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[0.0, 1.0], [0.8414709848078965, 0.5403023058681398]]"


def test_bench_command_without_torch_exits_with_the_hint(tmp_path):
    result = run_without(
        ["torch"],
        f"""
        import sys
        from posenc.cli import main
        sys.exit(main(["bench", "--preset", "quick", "--out", {str(tmp_path / "out")!r}]))
        """,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "posenc bench: error: posenc bench needs PyTorch: pip install 'posenc[bench]'"
    ]
    assert not (tmp_path / "out").exists()


def test_the_cause_is_shown_when_another_module_is_missing():
    cause = ModuleNotFoundError("No module named 'tensorflow'", name="tensorflow")
    assert str(missing("keras", "posenc.keras", cause)) == (
        "posenc.keras needs Keras 3 with a backend: pip install 'posenc[tf]' (TensorFlow) or "
        "'posenc[jax]' (JAX) (No module named 'tensorflow')"
    )


def test_the_transformers_integration_without_transformers_names_its_extra():
    result = run_without(
        ["transformers"],
        """
        try:
            import posenc.integrations.transformers
        except ImportError as exc:
            print(type(exc).__name__, exc)
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == (
        "ImportError posenc.integrations.transformers needs Hugging Face transformers: "
        "pip install 'posenc[transformers]'"
    )


def test_convert_rope_without_safetensors_exits_with_the_hint(tmp_path):
    (tmp_path / "in.safetensors").write_bytes(b"x")
    result = run_without(
        ["safetensors"],
        f"""
        from posenc.cli import main
        raise SystemExit(main(["convert-rope", {str(tmp_path / "in.safetensors")!r},
                               {str(tmp_path / "out.safetensors")!r}, "--to", "half",
                               "--heads", "2"]))
        """,
    )
    assert result.returncode == 1, result.stderr
    assert "pip install 'posenc[transformers]'" in result.stderr
    assert "Traceback" not in result.stderr
