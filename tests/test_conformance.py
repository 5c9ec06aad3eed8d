"""One suite for every front end: each scheme's output agrees with the NumPy core.

Parametrised over front ends × cases (see ``conformance.py``): ``numpy`` (the public
functions), ``torch`` (the modules), ``keras-tensorflow``, ``keras-jax`` and
``keras-torch`` (the Keras layers on each backend), ``jax`` (the pure functions),
``jax-jit`` (the same with positions and offsets traced under ``jax.jit``) and ``flax``
(the linen modules). A case decoded token by token (``decode=True``) is compared step
by step: each step's whole output against its part of the full call's. A front end whose
packages are not installed is *skipped* with the reason in the test summary;
``scripts/test.sh`` installs them all and sets ``POSENC_REQUIRE_ALL_FRONTENDS=1``, under
which a missing front end fails instead.

Keras fixes its backend when it is first imported, so the Keras cases of the backends
other than this process's own run in one subprocess per backend (``conformance.py
--keras``), whose outputs are compared here case by case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import conformance
from conformance import CASES, FRONTENDS, Case

HERE = Path(__file__).parent


def _in_process_keras_backend() -> str | None:
    """The backend Keras has (or will have) in this process, if Keras imports."""
    if conformance.missing_packages("keras-tensorflow")[:1] == ["keras"]:
        return None
    try:
        import keras
    except ImportError:
        return None
    return keras.backend.backend()


def _require(frontend: str) -> None:
    missing = conformance.missing_packages(frontend)
    if not missing:
        return
    message = f"front end {frontend}: {', '.join(missing)} not installed"
    if os.environ.get("POSENC_REQUIRE_ALL_FRONTENDS"):
        pytest.fail(f"{message}, but POSENC_REQUIRE_ALL_FRONTENDS is set")
    pytest.skip(message)


@pytest.fixture(scope="session")
def keras_subprocess(tmp_path_factory):
    """backend → (values by case id, errors by case id), computed once per backend."""
    results: dict[str, tuple[dict[str, np.ndarray], dict[str, str]]] = {}

    def get(backend: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
        if backend not in results:
            path = tmp_path_factory.mktemp(f"keras-{backend}") / "out.npz"
            env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
            done = subprocess.run(
                [sys.executable, str(HERE / "conformance.py"), "--keras", str(path)],
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            if done.returncode != 0:
                pytest.fail(
                    f"the keras-{backend} worker failed (exit {done.returncode}):\n"
                    f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
                )
            with np.load(path) as data:
                errors = json.loads(str(data["__errors__"]))
                values = {key: data[key] for key in data.files if key != "__errors__"}
            results[backend] = (values, errors)
        return results[backend]

    return get


def _output(frontend: str, case: Case, keras_subprocess) -> np.ndarray:
    if frontend.startswith("keras-"):
        backend = frontend.removeprefix("keras-")
        if backend != _in_process_keras_backend():
            values, errors = keras_subprocess(backend)
            if case.id in errors:
                pytest.fail(f"{frontend} raised on {case.id}: {errors[case.id]}")
            return values[case.id]
    return conformance.run(frontend, case)


PARAMS = [
    pytest.param(frontend, case, id=f"{frontend}-{case.id}")
    for frontend in FRONTENDS
    for case in conformance.cases_for(frontend)
]


@pytest.mark.parametrize(("frontend", "case"), PARAMS)
def test_front_end_matches_core(frontend: str, case: Case, keras_subprocess):
    _require(frontend)
    if case.raises and frontend not in case.computed_by:  # refused the same way
        error = {"ValueError": ValueError, "TypeError": TypeError}[case.raises]
        if frontend.startswith("keras-") and frontend[6:] != _in_process_keras_backend():
            _, errors = keras_subprocess(frontend[6:])
            assert errors.get(case.id, "").startswith(f"{case.raises}:"), errors.get(case.id)
            return
        with pytest.raises(error):
            conformance.run(frontend, case)
        return
    expected = conformance.expected(frontend, case)
    got = _output(frontend, case, keras_subprocess)
    assert got.shape == expected.shape, f"{frontend}: shape {got.shape} != {expected.shape}"
    assert got.dtype == np.float32
    atol = conformance.tolerance(case)
    if case.decode:  # each step's whole output against its part of the full call's
        for first, count, where in conformance.decode_views(case):
            _agree(
                got[where], expected[where], atol, f"the step of rows {first}..{first + count - 1}"
            )
    _agree(got, expected, atol, f"{frontend}: {case.id}")


def _agree(got: np.ndarray, expected: np.ndarray, atol: float, what: str) -> None:
    if atol == 0:
        np.testing.assert_array_equal(got, expected.astype(np.float32), err_msg=what)
    else:
        np.testing.assert_allclose(got, expected, rtol=0, atol=atol, err_msg=what)


def test_every_scheme_has_cases_and_every_front_end_is_listed():
    schemes = {case.scheme for case in CASES}
    assert schemes == set(conformance.SCHEMES)
    # Every scheme that takes positions has an out-of-range case, known and traced; the
    # N-D encoding takes no positions (a grid's shape), nor CoPE (it counts the keys), so
    # they have none.
    for traced in (False, True):
        past = {case.scheme for case in CASES if "table" in case.params and case.traced == traced}
        assert past == set(conformance.SCHEMES) - {"nd", *conformance.CONTEXTUAL}, (traced, past)
    for frontend in conformance.TRACING:
        assert any(case.traced for case in conformance.cases_for(frontend)), frontend
    assert len({case.id for case in CASES}) == len(CASES)
    assert {"numpy", "torch", "keras-tensorflow", "keras-jax", "keras-torch", "jax"} <= set(
        FRONTENDS
    )


def test_every_front_end_decodes_each_of_its_schemes_step_by_step():
    for frontend, (_, schemes) in FRONTENDS.items():
        decoded = {case.scheme for case in conformance.cases_for(frontend) if case.decode}
        assert decoded == set(schemes) & set(conformance.DECODED), frontend
    decode = [case for case in CASES if case.decode]
    assert {case.scheme for case in decode} == set(conformance.DECODED)
    for case in decode:
        assert not case.traced, case.id  # known positions: exact values
        assert case.raises is None, case.id
        steps = conformance.decode_steps(case)
        assert len(steps) >= 4, case.id
        assert all(count == 1 for _, count in steps[1:]), case.id  # then token by token
        if case.scheme in conformance.BIASES:  # every key up to the last query
            assert conformance.row_positions(case)[-1] + 1 == case.params["k"], case.id
    for scheme in conformance.BIASES:  # the offset given, and left to the default alignment
        given = {"offset" in case.params for case in decode if case.scheme == scheme}
        assert given == {True, False}, scheme
    # The tables grow during the decode: from a position inside to ones past them.
    for scheme in ("sinusoidal", "rope"):
        assert any(
            case.scheme == scheme
            and conformance.positions(case)[0] < case.table <= conformance.positions(case)[-1]
            for case in decode
        ), scheme
    for case in decode:  # the learned embedding cannot grow: its decode stays within it
        if case.scheme == "learned":
            assert conformance.positions(case)[-1] < case.params["max_length"], case.id


def test_the_bfloat16_case_differs_from_a_bfloat16_computation():
    """The bfloat16 cases are ones where computing in bfloat16 gives other numbers, so
    agreeing with the reference there is a real check of exact rounding."""
    case = next(c for c in CASES if c.id == "sinusoidal-bf16-far")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf16 = ml_dtypes.bfloat16
    p = case.params
    k = np.arange(p["start"], p["start"] + p["length"]).astype(bf16)[:, None]
    i = np.arange(0, p["d"], 2).astype(bf16)
    angle = k * np.power(bf16(10000.0), -(i / bf16(p["d"])))  # all in bfloat16
    naive = np.empty((p["length"], p["d"]), np.float32)
    naive[:, 0::2] = np.sin(angle.astype(np.float32)).astype(bf16).astype(np.float32)
    naive[:, 1::2] = np.cos(angle.astype(np.float32)).astype(bf16).astype(np.float32)
    expected = conformance.reference(case)[0]
    assert np.abs(naive - expected).max() > 0.1
