"""Minimal pytrees for parameters: nested tuples, lists and dicts with array or scalar leaves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def leaves(tree: Any) -> list[Any]:
    """The leaves of ``tree`` in a fixed order (dicts by insertion order)."""
    if isinstance(tree, dict):
        return [leaf for value in tree.values() for leaf in leaves(value)]
    if isinstance(tree, (list, tuple)):
        return [leaf for value in tree for leaf in leaves(value)]
    return [tree]


def rebuild(tree: Any, new_leaves: list[Any]) -> Any:
    """``tree`` with its leaves replaced, in order, by ``new_leaves``."""
    iterator = iter(new_leaves)
    result = _rebuild(tree, iterator)
    if next(iterator, None) is not None:
        raise ValueError("more leaves than the tree has")
    return result


def _rebuild(tree: Any, iterator: Any) -> Any:
    if isinstance(tree, dict):
        return {key: _rebuild(value, iterator) for key, value in tree.items()}
    if isinstance(tree, (list, tuple)):
        items = [_rebuild(value, iterator) for value in tree]
        return type(tree)(*items) if hasattr(tree, "_fields") else type(tree)(items)
    return next(iterator)


def structure(tree: Any) -> Any:
    """A hashable description of the tree's shape, for checking that trees match."""
    if isinstance(tree, dict):
        return ("dict", tuple((key, structure(value)) for key, value in tree.items()))
    if isinstance(tree, (list, tuple)):
        return (type(tree).__name__, tuple(structure(value) for value in tree))
    return "*"


def map_leaves(func: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``func`` applied to every leaf."""
    return rebuild(tree, [func(leaf) for leaf in leaves(tree)])
