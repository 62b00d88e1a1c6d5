"""Per-trajectory random streams that depend only on (seed, trajectory index, repeat).

Results must never depend on batching or scheduling, so every trajectory gets its own stream:
``trajectory_rng`` gives a NumPy ``Generator`` for one trajectory (the per-trajectory
``prob_func`` path), and ``counter_uniform`` gives the same kind of guarantee vectorized over an
index array (the batched path), by hashing ``(seed, index, repeat, draw)`` with SplitMix64.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def trajectory_rng(seed: int, index: int, repeat: int = 0) -> np.random.Generator:
    """The random generator of trajectory ``index`` (its ``repeat``-th attempt)."""
    return np.random.Generator(
        np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(index, repeat)))
    )


def _splitmix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        return x ^ (x >> np.uint64(31))


def counter_uniform(
    seed: int, indices: NDArray[np.integer], repeat: NDArray[np.integer], n_draws: int
) -> NDArray[np.float64]:
    """Uniforms in ``[0, 1)``, shape ``(len(indices), n_draws)``: draw ``k`` of trajectory ``i``
    depends only on ``(seed, i, repeat[i], k)`` (``0 <= seed < 2**64``, checked by ``solve``)."""
    idx = np.asarray(indices, dtype=np.uint64)[:, None]
    rep = np.asarray(repeat, dtype=np.uint64)[:, None]
    draw = np.arange(n_draws, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        key = _splitmix64(np.full_like(idx, np.uint64(seed)))
        key = _splitmix64(key ^ idx)
        key = _splitmix64(key ^ (rep * np.uint64(0x632BE59BD9B4E019)))
        bits = _splitmix64(key ^ (draw * np.uint64(0xD2B74407B1CE6E93)))
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53
