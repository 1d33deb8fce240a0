"""Tests for scripts/series.py's hunk split: members that share one file's edit, applied in order
with git apply, must give the file the whole edit gives (scripts/test.sh checks the real series)."""

import importlib.util
import os
import subprocess

import pytest

_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "scripts", "series.py")
_spec = importlib.util.spec_from_file_location("series_under_test", _PATH)
series = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(series)

BEFORE = "".join(f"line {i}\n" for i in range(1, 61))


def edit(text):
    """Three separate hunks that change the line count by +2, -3 and +1."""
    lines = text.splitlines(keepends=True)
    lines[5:6] = ["new a\n", "new b\n", "new c\n"]
    lines[27:31] = ["merged\n"]
    lines.insert(50, "added\n")
    return "".join(lines)


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def ranges(patch):
    return [line.split(" @@")[0] for line in patch.splitlines() if line.startswith("@@ ")]


@pytest.mark.parametrize("owners", [["01", "02", "01"], ["02", "01", "03"], ["03", "02", "01"], ["01"] * 3])
def test_members_compose_to_the_whole_edit(tmp_path, owners):
    (tmp_path / "f.txt").write_text(BEFORE)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "f.txt")
    (tmp_path / "f.txt").write_text(edit(BEFORE))
    section = git(tmp_path, "diff", "f.txt")
    assert len(series.split_hunks(section)[1]) == 3
    (tmp_path / "f.txt").write_text(BEFORE)
    nums = sorted(set(owners))
    states = []
    for i, n in enumerate(nums):
        member = series.renumber(section, owners, {n}, set(nums[:i]))
        (tmp_path / "m.patch").write_text(member)
        git(tmp_path, "apply", "m.patch")
        # git apply also accepts a hunk found at an offset, so the numbers
        # are compared with git's own diff of this step.
        assert ranges(member) == ranges(git(tmp_path, "diff", "f.txt"))
        git(tmp_path, "add", "f.txt")
        states.append((tmp_path / "f.txt").read_text())
    assert states[-1] == edit(BEFORE)
    # A prefix (the members up to k together, against the original) yields
    # the state after member k.
    for k, state in enumerate(states):
        (tmp_path / "f.txt").write_text(BEFORE)
        (tmp_path / "p.patch").write_text(series.renumber(section, owners, set(nums[:k + 1]), set()))
        git(tmp_path, "apply", "p.patch")
        assert (tmp_path / "f.txt").read_text() == state
