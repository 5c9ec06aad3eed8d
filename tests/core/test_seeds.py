"""The seed texts' worked examples, number for number (NumPy core)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numpy.testing import assert_allclose, assert_array_equal

import posenc
from seed_oracles import (
    SEED_000_TABLE,
    gen_pe_loop,
    generate_positional_encoding_numpy,
    getPositionEncoding,
)

# Seed 000: "I am a robot", n=100, d=4, L=4, printed to 8 decimals.

# Seed 003: gen_pe(10, 4, 100), printed to 4 decimals.
SEED_003_TABLE_N100 = np.array(
    [
        [0.0, 1.0, 0.0, 1.0],
        [0.8415, 0.5403, 0.0998, 0.995],
        [0.9093, -0.4161, 0.1987, 0.9801],
        [0.1411, -0.99, 0.2955, 0.9553],
        [-0.7568, -0.6536, 0.3894, 0.9211],
        [-0.9589, 0.2837, 0.4794, 0.8776],
        [-0.2794, 0.9602, 0.5646, 0.8253],
        [0.657, 0.7539, 0.6442, 0.7648],
        [0.9894, -0.1455, 0.7174, 0.6967],
        [0.4121, -0.9111, 0.7833, 0.6216],
    ]
)

# Seed 003: PositionalEncoding(4, 0.0, 10).state_dict()["pe"] (n=10000), 2 decimals.
SEED_003_BUFFER_N10000 = np.array(
    [
        [0.00, 1.00, 0.00, 1.00],
        [0.84, 0.54, 0.01, 1.00],
        [0.91, -0.42, 0.02, 1.00],
        [0.14, -0.99, 0.03, 1.00],
        [-0.76, -0.65, 0.04, 1.00],
        [-0.96, 0.28, 0.05, 1.00],
        [-0.28, 0.96, 0.06, 1.00],
        [0.66, 0.75, 0.07, 1.00],
        [0.99, -0.15, 0.08, 1.00],
        [0.41, -0.91, 0.09, 1.00],
    ]
)


def test_seed_000_i_am_a_robot_table():
    table = posenc.sinusoidal(4, 4, base=100, dtype=np.float64)
    assert_allclose(table, SEED_000_TABLE, rtol=0, atol=5e-9)
    # "the positional encoding matrix would be the same for any 4 letter phrase"
    assert_array_equal(
        table, posenc.sinusoidal(len(["I", "am", "a", "robot"]), 4, base=100.0, dtype="float64")
    )


@pytest.mark.parametrize("seq_len", [1, 2, 7, 33])
@pytest.mark.parametrize("d", [2, 4, 6, 16, 64])
@pytest.mark.parametrize("n", [2.0, 100, 10000])
def test_seed_000_loop_oracle(seq_len, d, n):
    assert_allclose(
        posenc.sinusoidal(seq_len, d, base=n, dtype=np.float64),
        getPositionEncoding(seq_len, d, n),
        rtol=0,
        atol=1e-13,
    )


def test_seed_000_odd_width_differs_from_seed_loop_only_in_the_last_column():
    # The seed loop leaves the last column of an odd-width table at 0; posenc fills it
    # with the sine of the next frequency on the ladder (see posenc.frequencies).
    ours = posenc.sinusoidal(9, 5, base=100, dtype=np.float64)
    seed = getPositionEncoding(9, 5, 100)
    assert_allclose(ours[:, :4], seed[:, :4], rtol=0, atol=1e-14)
    assert_array_equal(seed[:, 4], 0.0)
    assert_allclose(ours[:, 4], np.sin(np.arange(9) / 100 ** (4 / 5)), rtol=0, atol=1e-15)


def test_seed_003_table_n100():
    table = posenc.sinusoidal(10, 4, base=100, dtype=np.float64)
    assert_allclose(table, SEED_003_TABLE_N100, rtol=0, atol=5e-5 + 1e-12)
    assert_allclose(table, gen_pe_loop(10, 4, 100), rtol=0, atol=1e-15)


def test_seed_003_buffer_n10000():
    table = posenc.sinusoidal(10, 4, dtype=np.float64)
    assert_allclose(table, SEED_003_BUFFER_N10000, rtol=0, atol=5e-3 + 1e-12)


def test_seed_003_div_term():
    # div_term = exp(arange(0, d, 2) * -(log(n) / d)) printed as tensor([1.0000, 0.1000])
    assert posenc.frequencies(4, 100).tolist() == [1.0, 0.1]


@pytest.mark.parametrize(
    ("max_length", "d_model", "n"), [(10, 4, 100), (50, 32, 10000), (7, 10, 3)]
)
def test_seed_003_loop_oracle(max_length, d_model, n):
    assert_allclose(
        posenc.sinusoidal(max_length, d_model, base=n, dtype=np.float64),
        gen_pe_loop(max_length, d_model, n),
        rtol=0,
        atol=1e-14,
    )


def test_seed_001_numpy_function():
    # The seed's NumPy code forms float64 angles before its float32 cast: equal to within
    # one float32 rounding of the exact table.
    seed = generate_positional_encoding_numpy(60, 256)
    ours = posenc.sinusoidal(60, 256)
    assert seed.shape == (1, 60, 256)
    assert_allclose(ours, seed[0], rtol=0, atol=6e-8)


@pytest.mark.parametrize(("length", "d"), [(16, 64), (100, 512)])
def test_seed_004_and_002_picture_matrices(length, d):
    table = posenc.sinusoidal(length, d, dtype=np.float64)
    assert table.shape == (length, d)
    assert_allclose(table, getPositionEncoding(length, d, 10000), rtol=0, atol=1e-13)


def test_seed_000_wavelength_range():
    # "the wavelengths of the sinusoids form a geometric progression from 2π to 2πn"
    d, n = 512, 10000.0
    lam = posenc.wavelengths(d, n)
    assert lam[0] == 2 * math.pi
    assert_allclose(lam, 2 * math.pi * n ** (2 * np.arange(d // 2) / d), rtol=1e-15)
    assert_allclose(lam[1:] / lam[:-1], n ** (2 / d), rtol=1e-14)
    assert 2 * math.pi < lam[-1] < 2 * math.pi * n


def test_seed_002_wavelength_of_column_six():
    # d_model=50: "the function at i=6 index has a wavelength around 19 (2π·10^(12/25))"
    lam = posenc.wavelengths(50)[6 // 2]
    assert lam == pytest.approx(2 * math.pi * 10 ** (12 / 25), rel=1e-15)
    assert round(lam) == 19


def test_seed_002_first_columns_do_not_depend_on_d():
    # "The period of the first two indexes is not changing with the change of d_model"
    tables = [posenc.sinusoidal(30, d, dtype=np.float64) for d in (20, 50, 128)]
    for table in tables[1:]:
        assert_array_equal(table[:, :2], tables[0][:, :2])
    # ... while column 2 varies more slowly for smaller d (a longer wavelength).
    assert posenc.wavelengths(20)[1] > posenc.wavelengths(50)[1] > posenc.wavelengths(128)[1]


def test_seed_claims_unique_and_bounded():
    table = posenc.sinusoidal(1000, 64, dtype=np.float64)
    closest = posenc.min_pairwise_distance(table)
    assert closest.distance > 0.1
    assert np.all(np.abs(table) <= 1.0)
    # The closest pair is the closest offset (translation invariance), by closed form.
    offsets = np.arange(1, 1000)
    by_offset = posenc.offset_distances(offsets, 64)
    assert closest.distance == pytest.approx(by_offset.min(), rel=1e-9)
    assert closest.second - closest.first == offsets[np.argmin(by_offset)]
