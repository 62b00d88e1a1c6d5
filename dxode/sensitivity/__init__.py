"""Gradients of solutions: ``solve`` as an autograd primitive with adjoint backward passes."""

from .algorithms import (
    SENSEALGS,
    BacksolveAdjoint,
    DiscreteAdjoint,
    ForwardSensitivity,
    InterpolatingAdjoint,
)
from .differentiable import is_traced
from .entry import solve_ensemble_traced, solve_single_traced

__all__ = [
    "SENSEALGS",
    "BacksolveAdjoint",
    "DiscreteAdjoint",
    "ForwardSensitivity",
    "InterpolatingAdjoint",
    "is_traced",
    "solve_ensemble_traced",
    "solve_single_traced",
]
