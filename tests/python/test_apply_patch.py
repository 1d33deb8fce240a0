"""scripts/apply_patch.sh --apply must name its tree: without --pytorch it would patch the v2.9.1
baseline cache that the blob and compile checks read."""

import os
import subprocess

import pytest

_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "scripts",
                       "apply_patch.sh")


@pytest.mark.parametrize("extra", [[], ["--series"]])
def test_apply_without_a_tree_is_refused(tmp_path, extra):
    baseline = tmp_path / ".cache" / "pytorch-v2.9.1-mps-baseline"
    baseline.mkdir(parents=True)
    run = subprocess.run(["bash", _SCRIPT, "--apply", *extra], env={**os.environ, "HOME": str(tmp_path)},
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert "--apply needs --pytorch DIR" in run.stderr
    assert list(baseline.iterdir()) == []
