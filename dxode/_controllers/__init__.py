"""Step-size controllers: one contract, I/PI/PID implementations."""

from ._base import AbstractController
from ._pid import IController, PIController, PIDController

__all__ = ["AbstractController", "IController", "PIController", "PIDController"]
