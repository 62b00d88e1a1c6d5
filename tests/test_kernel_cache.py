"""What the kernel cache directory remembers besides numba's files: the probe compilations'
answers (does a user function take ``u`` as a tuple or as an array), so that a new process
loading cached kernels does not compile the probes again."""

from __future__ import annotations

import pytest

pytest.importorskip("numba")

from dxode.kernels import cache, compiler
from dxode.kernels.errors import KernelCompileError


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty kernel cache directory and no answers remembered in this process."""
    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(cache, "_MODES", {})
    return tmp_path


def test_an_answer_is_probed_once_and_then_read_from_disk(fresh_cache):
    calls = []

    def probe():
        calls.append(1)
        return True

    key = ("f", "digest", 3, "float64", "UniTuple(float64, 3)", "cpu")
    assert cache.remembered_mode(key, probe) is True
    assert cache.remembered_mode(key, probe) is True
    cache._MODES.clear()  # a new process: only the disk remembers
    assert cache.remembered_mode(key, lambda: pytest.fail("probed again")) is True
    assert calls == [1]
    (written,) = (fresh_cache / "modes").iterdir()
    assert written.read_text() == "array"


def test_failures_and_unreadable_answers_are_probed_again(fresh_cache):
    key = ("callback", "digest", "ContinuousCallback", 0, 2, "float32", "float32", "cpu")

    def fails():
        raise KernelCompileError("numba says no")

    with pytest.raises(KernelCompileError, match="numba says no"):
        cache.remembered_mode(key, fails)
    assert cache.remembered_mode(key, lambda: False) is False  # nothing was remembered
    (written,) = (fresh_cache / "modes").iterdir()
    written.write_text("garbage")
    cache._MODES.clear()
    assert cache.remembered_mode(key, lambda: True) is True
    assert written.read_text() == "array"


def test_an_unwritable_cache_costs_only_the_probe(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("DXODE_KERNEL_CACHE", str(blocker))
    monkeypatch.setattr(cache, "_MODES", {})
    assert cache.remembered_mode(("f", "x"), lambda: False) is False


def _rows(u, p, t):
    x, y = u
    return [-p[0] * x, x - y]


def _whole(u, p, t):
    return -p[0] * u  # array arithmetic: u must be an array


@pytest.mark.parametrize(("f", "answer"), [(_rows, "tuple"), (_whole, "array")])
def test_user_functions_answers_are_written_down(fresh_cache, f, answer):
    as_array = compiler.user_function_mode(f, 2, "float64", (0.5,), "cpu")
    assert as_array == (answer == "array")
    (written,) = (fresh_cache / "modes").iterdir()
    assert written.read_text() == answer
