"""Gradients of solutions: ``solve`` as an autograd primitive with adjoint backward passes."""

from .algorithms import (
    SENSEALGS,
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardSensitivity,
    InterpolatingAdjoint,
)
from .entry import solve_ensemble_traced, solve_single_traced

__all__ = [
    "SENSEALGS",
    "BacksolveAdjoint",
    "DiscreteAdjoint",
    "ForwardSensitivity",
    "InterpolatingAdjoint",
    "solve_ensemble_traced",
    "solve_single_traced",
]
