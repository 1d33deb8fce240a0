"""The pinned torch==2.9.1 wheels: download, sha256 check, partial unpack.

A pin is a tests/compile/*.tsv file holding one `file<TAB>sha256` row.
Wheels live in ~/.cache/torch-wheels; what a caller needs from one is
unpacked once under ~/.cache, stamped with the wheel's sha256. Used by
scripts/compile_check.py (macOS arm64 wheel: headers) and
scripts/glue_prepare.py (Linux x86_64 wheel: headers and libraries).
"""

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HOME_CACHE = os.path.join(os.path.expanduser("~"), ".cache")
WHEEL_DIR = os.path.join(HOME_CACHE, "torch-wheels")


class SetupError(Exception):
    pass


def read_pin(tsv):
    with open(tsv, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f
                if line.strip() and not line.startswith("#")]
    if len(rows) != 1 or len(rows[0]) < 2:
        raise SetupError(f"{tsv} must hold one 'file<TAB>sha256' row")
    return rows[0][0], rows[0][1]


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch(tsv, platform):
    """(path, sha256) of the pinned wheel, pip-downloaded when absent."""
    name, want = read_pin(tsv)
    path = os.path.join(WHEEL_DIR, name)
    if not os.path.isfile(path):
        os.makedirs(WHEEL_DIR, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--platform", platform, "--python-version", "3.11", "--implementation", "cp",
               "torch==2.9.1", "-d", WHEEL_DIR]
        print("downloading the wheel: " + " ".join(cmd), flush=True)
        if subprocess.run(cmd).returncode != 0 or not os.path.isfile(path):
            raise SetupError(f"could not download {name} into {WHEEL_DIR}")
    got = sha256_of(path)
    if got != want:
        raise SetupError(f"{path}: sha256 {got}, expected {want} ({tsv})")
    return path, want


def unpack(wheel, sha, dest, select):
    """Unpacks the members for which select(name) gives a relative path into
    dest, once: a dest stamped with the wheel's sha256 is reused as it is."""
    stamp = os.path.join(dest, ".wheel-sha256")
    if os.path.isfile(stamp) and open(stamp, encoding="utf-8").read().strip() == sha:
        return dest
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".unpack-", dir=os.path.dirname(dest))
    with zipfile.ZipFile(wheel) as z:
        for member in z.infolist():
            rel = None if member.is_dir() else select(member.filename)
            if rel is None:
                continue
            out_path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(out_path), exist_ok=True)
            with z.open(member) as src, open(out_path, "wb") as out:
                shutil.copyfileobj(src, out)
    with open(os.path.join(tmp, ".wheel-sha256"), "w", encoding="utf-8") as f:
        f.write(sha + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(tmp, dest)
    return dest
