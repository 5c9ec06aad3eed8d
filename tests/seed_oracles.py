"""The seed texts' own code, kept as written (names and all), used as test oracles.

Sources (in ../shared/seeds/): 000 — ``getPositionEncoding`` (NumPy nested loop);
001 — ``generate_positional_encoding`` (vectorised NumPy, float64 angles);
003 — ``gen_pe`` (nested loop with ``math.sin``), the ``div_term`` version and the
``PositionalEncoding`` module (PyTorch, float32 angles).
"""

from __future__ import annotations

import math

import numpy as np

# The table seed 000 prints for "I am a robot" (n = 100, d = 4), to its 8 decimals.
SEED_000_TABLE = np.array(
    [
        [0.0, 1.0, 0.0, 1.0],
        [0.84147098, 0.54030231, 0.09983342, 0.99500417],
        [0.90929743, -0.41614684, 0.19866933, 0.98006658],
        [0.14112001, -0.9899925, 0.29552021, 0.95533649],
    ]
)


def getPositionEncoding(seq_len, d, n=10000):  # seed 000
    P = np.zeros((seq_len, d))
    for k in range(seq_len):
        for i in np.arange(int(d / 2)):
            denominator = np.power(n, 2 * i / d)
            P[k, 2 * i] = np.sin(k / denominator)
            P[k, 2 * i + 1] = np.cos(k / denominator)
    return P


def gen_pe_loop(max_length, d_model, n):  # seed 003, nested loop
    pe = np.zeros(max_length * d_model).reshape(max_length, d_model)
    for k in np.arange(max_length):
        for i in np.arange(d_model // 2):
            theta = k / (n ** ((2 * i) / d_model))
            pe[k, 2 * i] = math.sin(theta)
            pe[k, 2 * i + 1] = math.cos(theta)
    return pe


def generate_positional_encoding_numpy(seq_length, embed_dim):  # seed 001, before tf.cast
    positions = np.arange(seq_length)[:, np.newaxis]
    dims = np.arange(embed_dim)[np.newaxis, :]
    angle_rates = 1 / np.power(10000, (2 * (dims // 2)) / np.float32(embed_dim))
    angle_radians = positions * angle_rates
    angle_radians[:, 0::2] = np.sin(angle_radians[:, 0::2])
    angle_radians[:, 1::2] = np.cos(angle_radians[:, 1::2])
    positional_encoding = angle_radians[np.newaxis, ...]
    return positional_encoding.astype(np.float32)


def gen_pe_torch(max_length, d_model, n):  # seed 003, vectorised with div_term
    import torch

    div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(n) / d_model))
    k = torch.arange(0, max_length).unsqueeze(1)
    pe = torch.zeros(max_length, d_model)
    pe[:, 0::2] = torch.sin(k * div_term)
    pe[:, 1::2] = torch.cos(k * div_term)
    pe = pe.unsqueeze(0)
    return pe


def seed_positional_encoding_class():  # seed 003, the module
    import torch
    from torch import Tensor, nn

    class PositionalEncoding(nn.Module):
        def __init__(self, d_model: int, dropout: float = 0.1, max_length: int = 5000):
            super().__init__()
            self.dropout = nn.Dropout(p=dropout)
            pe = torch.zeros(max_length, d_model)
            k = torch.arange(0, max_length).unsqueeze(1)
            div_term = torch.exp(torch.arange(0, d_model, 2) * -(math.log(10000.0) / d_model))
            pe[:, 0::2] = torch.sin(k * div_term)
            pe[:, 1::2] = torch.cos(k * div_term)
            pe = pe.unsqueeze(0)
            self.register_buffer("pe", pe)

        def forward(self, x: Tensor):
            x = x + self.pe[:, : x.size(1)].requires_grad_(False)
            return self.dropout(x)

    return PositionalEncoding
