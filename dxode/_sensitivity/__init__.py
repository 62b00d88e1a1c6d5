"""Gradients of solutions: ``solve`` as an autograd primitive with adjoint backward passes."""

from ._differentiable import DiscreteAdjoint, is_traced
from ._entry import solve_ensemble_traced, solve_single_traced

__all__ = ["DiscreteAdjoint", "is_traced", "solve_ensemble_traced", "solve_single_traced"]
