"""Step-size controllers: one contract, I/PI/PID implementations."""

from .base import AbstractController
from .pid import IController, PIController, PIDController

__all__ = ["AbstractController", "IController", "PIController", "PIDController"]
