"""Every method × backend × dtype: the core runs on NumPy, array_api_strict and CuPy alike."""

from __future__ import annotations

import math

import array_api_compat
import numpy as np
import pytest

import dxode

from conftest import to_numpy
from matrix import ADAPTIVE, FIXED_STEP, matrix, namespace
from problems import oscillator


def _problem(xp, dtype_name):
    dtype = getattr(xp, dtype_name)
    return dxode.ODEProblem(oscillator, xp.asarray([1.0, 0.0], dtype=dtype), (0.0, 2.0))


def _check_result(xp, sol, dtype_name, tol):
    assert array_api_compat.array_namespace(sol.u) is array_api_compat.array_namespace(
        xp.asarray([0.0])
    )
    assert sol.u.dtype == getattr(xp, dtype_name)
    assert sol.t.dtype == getattr(xp, dtype_name)
    assert sol.retcode == dxode.ReturnCode.Success
    end = to_numpy(sol.u[-1, ...])
    np.testing.assert_allclose(end, [math.cos(2.0), -math.sin(2.0)], atol=tol)


@pytest.mark.parametrize(("backend", "dtype_name", "alg"), matrix(ADAPTIVE))
def test_adaptive_methods(backend, dtype_name, alg):
    xp = namespace(backend)
    tol = 1e-6 if dtype_name == "float64" else 1e-4
    sol = dxode.solve(_problem(xp, dtype_name), alg(), rtol=tol, atol=tol)
    _check_result(xp, sol, dtype_name, 50 * tol)
    dense = sol(xp.asarray([0.5, 1.5], dtype=getattr(xp, dtype_name)))
    assert dense.dtype == getattr(xp, dtype_name)
    np.testing.assert_allclose(to_numpy(dense)[:, 0], np.cos([0.5, 1.5]), atol=50 * tol)


@pytest.mark.parametrize(("backend", "dtype_name", "alg"), matrix(FIXED_STEP))
def test_fixed_step_methods(backend, dtype_name, alg):
    xp = namespace(backend)
    dt = 1e-3 if alg is dxode.Euler else 1e-2
    sol = dxode.solve(_problem(xp, dtype_name), alg(), dt=dt)
    tol = 5e-3 if alg is dxode.Euler else (1e-6 if dtype_name == "float64" else 1e-4)
    _check_result(xp, sol, dtype_name, tol)


def test_saveat_and_float32_time_grid(xp, dtype_name):
    sol = dxode.solve(_problem(xp, dtype_name), dxode.Tsit5(), saveat=0.5, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(to_numpy(sol.t), [0.0, 0.5, 1.0, 1.5, 2.0])
    assert sol.u.shape == (5, 2)
    np.testing.assert_allclose(to_numpy(sol.u)[:, 0], np.cos(to_numpy(sol.t)), atol=1e-3)


def test_matrix_state_keeps_its_shape(xp):
    # One lane with a matrix state: f sees the whole (2, 3) array.
    def f(u, p, t):
        return -u

    u0 = xp.reshape(xp.arange(6, dtype=xp.float64) + 1.0, (2, 3))
    sol = dxode.solve(dxode.ODEProblem(f, u0, (0.0, 1.0)), rtol=1e-8, atol=1e-8)
    assert sol.u.shape[1:] == (2, 3)
    np.testing.assert_allclose(to_numpy(sol.u[-1, ...]), to_numpy(u0) * math.exp(-1.0), rtol=1e-6)


def test_import_dxode_does_not_import_cupy_or_dask():
    import subprocess
    import sys

    code = "import sys, dxode, dxode.backends; print('cupy' in sys.modules, 'dask' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_backend_lookup():
    from dxode.backends import NumpyBackend, backend_for, get_backend

    assert isinstance(get_backend("numpy"), NumpyBackend)
    assert backend_for(np.zeros(2)) is get_backend("numpy")
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        get_backend("tpu")


def test_add_to_lanes_adds_at_the_named_lanes_only(xp):
    from dxode.backends import backend_for

    target = xp.reshape(xp.arange(12, dtype=xp.float64), (2, 6))
    backend = backend_for(target)
    values = xp.asarray([[10.0, 20.0], [30.0, 40.0]], dtype=xp.float64)
    positions = xp.asarray([4, 1], dtype=xp.int64)
    out = backend.add_to_lanes(target, positions, values)
    expected = np.arange(12, dtype=np.float64).reshape(2, 6)
    expected[:, [4, 1]] += [[10.0, 20.0], [30.0, 40.0]]
    np.testing.assert_array_equal(to_numpy(out), expected)


def test_stack_rows_into_out_copies_lane_rows_and_still_refuses_a_one_lane_row(xp):
    # Rows that are arrays of the row shape take a shortcut into out=; a row of one lane
    # beside rows of four (which would broadcast one lane's value to all) is still refused,
    # and a constant row still fills its row.
    from dxode.backends import backend_for

    rows = [xp.asarray([1.0, 2.0, 3.0, 4.0]), xp.asarray([5.0, 6.0, 7.0, 8.0])]
    backend = backend_for(rows[0])
    out = xp.zeros((2, 4), dtype=xp.float64)
    assert backend.stack_rows(rows, out=out) is out
    np.testing.assert_array_equal(to_numpy(out), [[1, 2, 3, 4], [5, 6, 7, 8]])
    backend.stack_rows([rows[0], 2.5], out=out)
    np.testing.assert_array_equal(to_numpy(out), [[1, 2, 3, 4], [2.5] * 4])
    with pytest.raises(ValueError, match=r"row 1 .* shape \(1,\)"):
        backend.stack_rows([rows[0], xp.asarray([9.0])], out=out)


def test_a_solution_pickles_with_its_backend_by_name():
    cloudpickle = pytest.importorskip("cloudpickle")
    xps = pytest.importorskip("array_api_strict")
    from dxode.backends import get_backend

    prob = dxode.ODEProblem(lambda u, p, t: -u, xps.asarray([1.0, 2.0]), (0.0, 1.0))
    sol = dxode.solve(prob, dxode.Tsit5())
    back = cloudpickle.loads(cloudpickle.dumps(sol))
    assert np.array_equal(np.asarray(back(0.5)), np.asarray(sol(0.5)))
    numpy_backend = cloudpickle.loads(cloudpickle.dumps(get_backend("numpy")))
    assert type(numpy_backend) is type(get_backend("numpy"))


def _numpy_rows(u, p, t):
    return np.zeros(tuple(u.shape))


def _numpy_jacobian(u, p, t):
    return np.zeros((2, 2))


@pytest.mark.parametrize(
    ("alg", "derivatives", "who"),
    [
        (dxode.Tsit5(), {}, "f"),
        (dxode.Rodas5P(), {"jac": _numpy_jacobian}, "jac"),
        (dxode.Rodas5P(), {"tgrad": lambda u, p, t: np.zeros(2)}, "tgrad"),
    ],
)
def test_a_numpy_array_returned_for_an_array_api_state_is_refused_naming_both_libraries(
    alg, derivatives, who
):
    # Before, f's NumPy array was called a dtype mismatch ("returned dtype float64 for a
    # array_api_strict.float64 state", after array_api_strict's warning about comparing the
    # two libraries' dtypes), and a jac's or tgrad's failed inside array_api_strict's astype.
    xps = pytest.importorskip("array_api_strict")
    f = _numpy_rows if who == "f" else (lambda u, p, t: -u)
    prob = dxode.ODEProblem(f, xps.asarray([1.0, 2.0]), (0.0, 1.0), **derivatives)
    message = f"{who}\\(u, p, t\\) returned an array of numpy for a state of array_api_strict"
    with pytest.raises(TypeError, match=message):
        dxode.solve(prob, alg)


def test_a_numpy_state_returned_by_an_affect_for_an_array_api_state_is_refused_by_library():
    # The affect's NumPy array was called a dtype mismatch, after array_api_strict's warning
    # about comparing the two libraries' dtypes.
    xps = pytest.importorskip("array_api_strict")
    prob = dxode.ODEProblem(lambda u, p, t: -u, xps.asarray([1.0, 2.0]), (0.0, 1.0))
    reset = dxode.PresetTimeCallback([0.5], lambda u, p, t, fired: np.ones(2))
    message = r"callback 0: affect returned an array of numpy for a state of array_api_strict"
    with pytest.raises(TypeError, match=message):
        dxode.solve(prob, "tsit5", callback=reset)
