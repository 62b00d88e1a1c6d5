"""Callbacks: what users write, how the integrator locates and applies them, what is recorded."""
