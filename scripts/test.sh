#!/usr/bin/env bash
# The whole test suite, from a fresh clone: make .venv, install posenc with every
# extra (PyTorch, TensorFlow/Keras, JAX/Flax, ..., and the documentation site's tools)
# and the test group, then lint, build the site (strict: any warning fails) and run
# pytest. Safe to re-run.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
# The CPU build of PyTorch first, so that the torch>= requirement of posenc[torch] is
# already met and pip does not fetch the newest release with its CUDA packages.
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
pip_install() { .venv/bin/python -m pip install --quiet --disable-pip-version-check "$@"; }
pip_install --upgrade "pip>=25.1"          # for --group (PEP 735 dependency groups)
pip_install "$TORCH_SPEC"
pip_install -e ".[all,docs]" --group test

# Every front end is installed above: the conformance suite may skip none of them.
export POSENC_REQUIRE_ALL_FRONTENDS=1
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
# The documentation site, with its API reference, pictures and explorer (mkdocs.yml:
# strict, so a broken link or reference fails here). Written outside the clone.
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --quiet --site-dir "$SITE"
# One pytest worker per usable core, at most four (pytest-xdist): each worker runs its
# frameworks with one thread (conftest.py), and every worker imports PyTorch, TensorFlow
# and JAX, so more workers cost memory faster than they save time. POSENC_TEST_WORKERS
# overrides the count (0: no workers, the tests in this process).
CORES=$(.venv/bin/python -c "import os; print(len(os.sched_getaffinity(0)))" 2>/dev/null || nproc)
WORKERS=${POSENC_TEST_WORKERS:-$(( CORES < 4 ? CORES : 4 ))}
.venv/bin/python -m pytest -n "$WORKERS" "$@"
