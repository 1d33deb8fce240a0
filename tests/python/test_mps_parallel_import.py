"""What of the macOS MPS suite can be checked here, with Debian's CPU torch (>= 1.13).

- fork-overlay/test/test_mps_parallel.py imports and skips every test cleanly without MPS;
  pointed at the CPU, its thread-handling tests pass and its subprocess scenarios run.
- The torch/mps/__init__.py additions (a .diff against v2.9.1) parse, define the new API and
  behave as thin wrappers, checked against a stand-in for torch; Module.cpp registers the
  binding they call.
- scripts/macos/bench_mps_parallel.py runs on CPU and writes its JSON.
"""

import ast
import collections.abc
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import types
import typing
import unittest

import pytest
import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
SUITE = os.path.join(ROOT, "fork-overlay", "test", "test_mps_parallel.py")
INIT_DIFF = os.path.join(ROOT, "fork-overlay", "torch", "mps", "__init__.py.diff")
MODULE_DIFF = os.path.join(ROOT, "fork-overlay", "torch", "csrc", "mps", "Module.cpp.diff")
BENCH = os.path.join(ROOT, "scripts", "macos", "bench_mps_parallel.py")
# Debian has no expecttest, which torch's common_utils (the suite's TestCase) imports.
STUBS = os.path.join(ROOT, "tests", "python", "stubs")
if importlib.util.find_spec("expecttest") is None:
    sys.path.append(STUBS)
BASELINE = os.path.join(os.path.expanduser("~"), ".cache", "pytorch-v2.9.1-mps-baseline")
NEW_FUNCTIONS = {"current_stream", "set_stream", "stream", "release_current_thread_slot"}
NEW_NAMES = NEW_FUNCTIONS | {"BatchQueue", "batch_inference"}


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def suite():
    return load("test_mps_parallel_under_test", SUITE)


def run(tests):
    result = unittest.TestResult()
    tests.run(result)
    problems = [f"{test.id()}:\n{tb}" for test, tb in result.errors + result.failures]
    assert not problems, "\n".join(problems)
    return result


# ------------------------------------------------------ test/test_mps_parallel.py

def test_suite_imports_and_every_test_skips_without_mps(suite):
    assert not suite.TEST_MPS and not suite.TEST_STREAM_POOL
    result = run(unittest.defaultTestLoader.loadTestsFromModule(suite))
    assert result.testsRun >= 30
    assert len(result.skipped) == result.testsRun
    reasons = {reason for _, reason in result.skipped}
    assert reasons <= {"MPS is not available", "needs MPS and PyTorch built with the MPS stream pool"}, reasons


def test_thread_tests_pass_on_cpu(suite):
    tests = unittest.TestSuite()
    for cls in (suite.TestMPSParallelForward, suite.TestMPSCrossThread, suite.TestMPSThreadChurn):
        on_cpu = type("Cpu" + cls.__name__, (cls,), {"device": "cpu", "iters": 2, "busy_size": 64})
        tests.addTests(unittest.defaultTestLoader.loadTestsFromTestCase(on_cpu))
    result = run(tests)
    assert result.testsRun == 14 and not result.skipped


def test_child_scenarios_run_on_cpu(suite, tmp_path):
    def child(*args):
        return suite._child_main([*args, "--device", "cpu"])

    assert child("hold", "--threads", "40") == {"ok": 40, "errors": []}
    assert child("release", "--threads", "40") == {"ok": 40, "errors": []}
    timed = child("timeout", "--holders", "4", "--timeout-ms", "200")
    assert (timed["first"], timed["second"], timed["held_ok"]) == ("ok", "ok", 4)
    assert child("churn", "--total", "40", "--wave", "8", "--hold", "31") == {"churn_ok": 40, "ok": 31, "errors": []}
    assert child("probe") == {"outcome": "ok"}
    assert child("graph_probe") == {"outcome": "ok"}
    assert child("parallel", "--threads", "2") == {name: "ok" for name in suite.MODELS}
    out = str(tmp_path / "outputs.pt")
    assert child("outputs", "--out", out) == {"saved": 7}
    saved = torch.load(out)
    torch.testing.assert_close(saved["device"], saved["cpu"])


def test_child_command_line_runs_the_fork_scenario(suite):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), STUBS) if p))
    proc = subprocess.run([sys.executable, SUITE, suite.CHILD_FLAG, "fork", "--device", "cpu"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"message": "ok", "exitcode": 0}


# ------------------------------------------------------------ torch.mps additions

def added_code(diff_path):
    """Runs of consecutive added lines of a diff that parse as Python on their own, as one module."""
    runs, current = [], []
    with open(diff_path) as f:
        for line in f.read().splitlines():
            if line.startswith("+") and not line.startswith("+++"):
                current.append(line[1:])
            elif current:
                runs.append(current)
                current = []
    if current:
        runs.append(current)
    body = []
    for lines in runs:
        try:
            body.extend(ast.parse("\n".join(lines) + "\n").body)
        except SyntaxError:
            continue  # e.g. entries added inside the __all__ list
    return ast.Module(body=body, type_ignores=[])


def added_functions():
    return {n.name: n for n in added_code(INIT_DIFF).body if isinstance(n, ast.FunctionDef)}


def test_mps_init_additions_define_the_new_api():
    functions = added_functions()
    assert NEW_FUNCTIONS <= set(functions), sorted(functions)
    for name in NEW_FUNCTIONS:
        assert ast.get_docstring(functions[name]), f"{name} has no docstring"
    decorators = [ast.unparse(d) for d in functions["stream"].decorator_list]
    assert decorators == ["contextlib.contextmanager"]
    imports = [n for n in added_code(INIT_DIFF).body if isinstance(n, ast.ImportFrom) and n.module == "batch_queue"]
    assert [(n.level, sorted(a.name for a in n.names)) for n in imports] == [(1, ["BatchQueue", "batch_inference"])]


class FakeStream:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"FakeStream({self.name})"


class FakeTorch:
    """The parts of torch that the torch.mps wrappers use; records the calls."""

    Stream = FakeStream

    def __init__(self):
        self.calls = []
        self.current = FakeStream("default")
        self.accelerator = types.SimpleNamespace(current_stream=self._current_stream, set_stream=self._set_stream)
        self._C = types.SimpleNamespace(_mps_releaseThreadSlot=lambda: self.calls.append(("release",)))

    @staticmethod
    def device(kind):
        return ("device", kind)

    def _current_stream(self, *args):
        self.calls.append(("current_stream",) + args)
        return self.current

    def _set_stream(self, stream):
        self.calls.append(("set_stream", stream))
        self.current = stream


def test_mps_init_wrappers_forward_to_torch_accelerator():
    fake = FakeTorch()
    namespace = {"torch": fake, "contextlib": contextlib, "Iterator": collections.abc.Iterator,
                 "Optional": typing.Optional, "Union": typing.Union}
    module = ast.Module(body=list(added_functions().values()), type_ignores=[])
    exec(compile(module, INIT_DIFF, "exec"), namespace)
    mps = types.SimpleNamespace(**{name: namespace[name] for name in NEW_FUNCTIONS})
    default, s1, s2 = fake.current, FakeStream("s1"), FakeStream("s2")

    assert mps.current_stream() is default
    assert fake.calls == [("current_stream", ("device", "mps"))]

    with mps.stream(s1):
        assert fake.current is s1
        with mps.stream(s2):
            assert mps.current_stream() is s2
        assert fake.current is s1
    assert fake.current is default

    calls = len(fake.calls)
    with mps.stream(None):
        assert fake.current is default
    assert len(fake.calls) == calls, "stream(None) must not touch the current stream"

    with pytest.raises(KeyError):
        with mps.stream(s1):
            raise KeyError("leaves the block")
    assert fake.current is default

    mps.set_stream(s2)
    assert fake.current is s2 and fake.calls[-1] == ("set_stream", s2)
    mps.release_current_thread_slot()
    assert fake.calls[-1] == ("release",)


def test_module_cpp_registers_the_binding_python_calls():
    with open(MODULE_DIFF) as f:
        added = "\n".join(line[1:] for line in f.read().splitlines() if line.startswith("+"))
    binding = added_functions()["release_current_thread_slot"].body[-1].value.func.attr
    assert binding == "_mps_releaseThreadSlot"
    assert f'{{"{binding}",' in added
    assert "getMPSHooks().releaseCurrentThreadSlot();" in added


@pytest.mark.skipif(not os.path.isdir(BASELINE), reason=f"v2.9.1 baseline cache {BASELINE} absent")
def test_patched_mps_init_compiles_and_exports_the_new_names(tmp_path):
    target = tmp_path / "torch" / "mps" / "__init__.py"
    target.parent.mkdir(parents=True)
    shutil.copy(os.path.join(BASELINE, "torch", "mps", "__init__.py"), target)
    subprocess.run(["git", "apply", INIT_DIFF], cwd=tmp_path, check=True)
    tree = ast.parse(target.read_text())
    compile(tree, str(target), "exec")
    defined = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined.update(a.asname or a.name.split(".")[0] for a in node.names)
    exported = next(ast.literal_eval(n.value) for n in tree.body
                    if isinstance(n, ast.Assign) and [t.id for t in n.targets] == ["__all__"])
    assert NEW_NAMES <= set(exported)
    assert set(exported) <= defined, set(exported) - defined


# ------------------------------------------------------ scripts/macos benchmark

def test_benchmark_runs_on_cpu(tmp_path, capsys):
    bench = load("bench_mps_parallel_under_test", BENCH)
    status = bench.main(["--device", "cpu", "--models", "linear,transformer", "--threads", "1,2", "--iters", "2",
                         "--warmup", "1", "--batching-threads", "2", "--requests", "3", "--out", str(tmp_path)])
    assert status == 0
    result = json.loads((tmp_path / bench.JSON_NAME).read_text())
    for name in ("linear", "transformer"):
        rows = result["scaling"][name]["rows"]
        assert [(r["threads"], r["ops"], r["errors"]) for r in rows] == [(1, 2, []), (2, 4, [])]
        assert rows[0]["speedup"] == 1.0
    (row,) = result["batching"]["rows"]
    assert row["callers"] == 2 and not row["threading"]["errors"] and not row["batching"]["errors"]
    assert result["system"]["device"] == "cpu"
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert (tmp_path / bench.PNG_NAME).exists() == has_matplotlib
    if not has_matplotlib:
        assert "matplotlib is not installed" in capsys.readouterr().out
