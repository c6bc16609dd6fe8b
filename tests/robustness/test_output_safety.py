"""Issue 6 part 3: output safety through the real CLI (and save_model where a signal or a uid change
has to land inside the write).

- An output that is the input (same path, another spelling, a hard link, a symlink) or whose data
  file is the input's external-data file is refused with exit 8, compared by device and inode.
- kill -9 or Ctrl-C in the middle of the write, a full disk (RLIMIT_FSIZE) and a permission error
  leave no partial file at the destination (an existing destination keeps its old bytes).
- The output is byte-identical across runs and PYTHONHASHSEED values.
- Models over the 2 GB threshold are written with external data (threshold lowered, not 2 GB written).
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest

from graphopt.errors import WriteFailed
from graphopt.ir.io import DEFAULT_EXTERNAL_THRESHOLD, PROTOBUF_LIMIT, save_model
from tests.robustness._cli import assert_refused, run_many, snapshot
from tests.robustness._models import conv_relu, externalize

ROOT = Path(__file__).resolve().parents[2]
SAMPLES = sorted((ROOT / "models").glob("*.onnx"))


def _env(**extra):
    env = dict(os.environ)
    env.pop("GRAPHOPT_DEBUG", None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


# ------------------------------------------------------------------ output == input
def _same_file_cases(root: Path):
    """(label, folder, argv): every way of naming the input (or its data file) as the output."""
    cases = []
    root.mkdir()

    def folder(name):
        d = root / name
        d.mkdir()
        m = d / "m.onnx"
        m.write_bytes(conv_relu().SerializeToString())
        return d, m

    d, m = folder("same-path")
    cases.append(("same path", d, [m, "-o", m]))
    d, m = folder("spelling")
    (d / "sub").mkdir()
    cases.append(("./sub/../m.onnx spelling", d, [m, "-o", f"{d}/./sub/../m.onnx"]))
    d, m = folder("relative")
    cases.append(("relative spelling of an absolute input", d, [m, "-o", "m.onnx"]))
    d, m = folder("hardlink")
    os.link(m, d / "h.onnx")
    cases.append(("hard link to the input", d, [m, "-o", d / "h.onnx"]))
    d, m = folder("symlink")
    os.symlink("m.onnx", d / "s.onnx")
    cases.append(("symlink to the input", d, [m, "-o", d / "s.onnx"]))
    d, m = folder("symlinked-input")
    os.symlink("m.onnx", d / "s.onnx")
    cases.append(("input given through a symlink, output the real file", d, [d / "s.onnx", "-o", m]))
    # external data: the output's data file (OUT.data) would be the input's data file
    d = root / "ext-data"
    d.mkdir()
    (d / "m.onnx").write_bytes(externalize(conv_relu(), d, "o.onnx.data").SerializeToString())
    cases.append(("output data file = the input's data file", d, [d / "m.onnx", "-o", d / "o.onnx"]))
    d = root / "ext-symlink"
    d.mkdir()
    (d / "m.onnx").write_bytes(externalize(conv_relu(), d, "w.bin").SerializeToString())
    (d / "out").mkdir()
    os.symlink("../w.bin", d / "out" / "o.onnx.data")
    cases.append(("output data file = a symlink to the input's data file", d, [d / "m.onnx", "-o", d / "out" / "o.onnx"]))
    d = root / "ext-is-output"
    d.mkdir()
    (d / "m.onnx").write_bytes(externalize(conv_relu(), d, "w.bin").SerializeToString())
    cases.append(("output = the input's data file", d, [d / "m.onnx", "-o", d / "w.bin"]))
    return cases


def test_output_that_is_the_input_is_refused(tmp_path):
    cases = _same_file_cases(tmp_path / "cases")
    before = snapshot(tmp_path / "cases")
    runs = run_many([(["optimize", *map(str, argv), "--gpu", "none"], d) for _, d, argv in cases], tmp_path)
    for (label, d, argv), r in zip(cases, runs):
        assert_refused(r, 8, label)
    assert snapshot(tmp_path / "cases") == before  # nothing written, nothing changed, no temp files


def test_control_a_different_output_path_is_written(tmp_path):
    m = tmp_path / "m.onnx"
    m.write_bytes(externalize(conv_relu(), tmp_path, "w.bin").SerializeToString())
    (r,) = run_many([(["optimize", m, "--gpu", "none", "-q", "-o", tmp_path / "o.onnx"], tmp_path)], tmp_path)
    assert r.returncode == 0, r.stderr
    onnx.checker.check_model(onnx.load(str(tmp_path / "o.onnx")))


# ------------------------------------------------------------------ interrupted writes
_SLOW_WRITE = textwrap.dedent("""
    import os, sys, time
    import graphopt.ir.io as io
    real_fsync = os.fsync
    def slow_fsync(fd):
        # inside _atomic_write: the temp file is written, not yet renamed into place
        sys.stderr.write("IN-WRITE\\n"); sys.stderr.flush()
        time.sleep(60)
        real_fsync(fd)
    io.os.fsync = slow_fsync
    from graphopt.cli import main
    main(args=sys.argv[1:], prog_name="graphopt")
""")


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM], ids=["kill-9", "ctrl-c", "sigterm"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "existing"])
def test_signal_mid_write_leaves_no_partial_file(tmp_path, sig, existing):
    src = SAMPLES[0]
    out = tmp_path / "out.onnx"
    if existing:
        out.write_bytes(b"previous output")
    script = tmp_path / "slow.py"
    script.write_text(_SLOW_WRITE)
    # A shell without job control starts background jobs with SIGINT ignored, and the child inherits that
    # (then Python installs no KeyboardInterrupt handler and ctrl-c is rightly ignored). The test plays a
    # user at a terminal, so the child gets the default disposition whatever ran pytest.
    p = subprocess.Popen([sys.executable, str(script), "optimize", str(src), "--gpu", "none", "-q", "-o", str(out)],
                         cwd=tmp_path, env=_env(), stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert p.stderr.readline().strip() == "IN-WRITE"
        temps = [q for q in tmp_path.iterdir() if q.name.startswith(".out.onnx.")]
        assert len(temps) == 1 and temps[0].stat().st_size > 0, "the hook fired inside the temp-file write"
        p.send_signal(sig)
        rest = p.stderr.read()
        code = p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    if existing:
        assert out.read_bytes() == b"previous output"
    else:
        assert not out.exists()
    if sig in (signal.SIGINT, signal.SIGTERM):
        assert code == (130 if sig == signal.SIGINT else 143), rest
        word = "interrupted" if sig == signal.SIGINT else "terminated"
        assert rest.strip().splitlines() == [f"graphopt: {word}; nothing was written"], rest
        assert sorted(q.name for q in tmp_path.iterdir()) == sorted(["slow.py"] + (["out.onnx"] if existing else []))
    else:
        assert code == -signal.SIGKILL
        # kill -9 cannot clean up: the dot-named temp file may stay, but never under the destination's name


def test_full_disk_leaves_nothing_partial(tmp_path):
    """RLIMIT_FSIZE below the output size: the write fails with EFBIG (SIGXFSZ ignored, as a full disk
    fails with ENOSPC): exit 11, one line, no destination, no temp file; an existing file is kept."""
    src = next(p for p in SAMPLES if p.stat().st_size > 50_000)
    out = tmp_path / "out.onnx"
    limit = 20_000

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    for existing in (False, True):
        if existing:
            out.write_bytes(b"previous output")
        r = subprocess.run([sys.executable, "-m", "graphopt.cli", "optimize", str(src), "--gpu", "none", "-q", "-o", str(out)],
                           cwd=tmp_path, env=_env(PYTHONDONTWRITEBYTECODE="1"), capture_output=True, text=True,
                           preexec_fn=limited, timeout=300)
        assert_refused(r, 11, "RLIMIT_FSIZE")
        assert "nothing was written" in r.stderr
        assert sorted(q.name for q in tmp_path.iterdir()) == (["out.onnx"] if existing else [])
        if existing:
            assert out.read_bytes() == b"previous output"


@pytest.mark.parametrize("where", ["read-only folder", "folder it cannot enter"])
def test_permission_denied_leaves_nothing_partial(where):
    """A folder the process may not write to (or not even enter): WriteFailed (exit 11 in the CLI),
    one line, nothing left. When the tests run as root (which ignores folder permissions) the write
    runs as nobody in a forked child."""
    base = Path(tempfile.mkdtemp(prefix="graphopt-perm-"))
    try:
        base.chmod(0o755 if where == "read-only folder" else 0o700)
        folder = base / "ro"
        folder.mkdir()
        folder.chmod(0o555 if os.geteuid() != 0 else 0o755)
        if where == "folder it cannot enter" and os.geteuid() != 0:
            base.chmod(0o000)
        model = conv_relu()
        pid = os.fork()
        if pid == 0:  # child: never returns into pytest
            code = 3
            try:
                if os.geteuid() == 0:
                    os.setgid(65534)
                    os.setuid(65534)
                save_model(model, folder / "out.onnx")
                code = 2
            except WriteFailed as e:
                code = 0 if ("out.onnx" in str(e) and "\n" not in str(e)) else 4
            except BaseException as e:
                print(f"unexpected {type(e).__name__}: {e}", file=sys.stderr)
                code = 5
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        base.chmod(0o755)
        folder.chmod(0o755)
        assert os.waitstatus_to_exitcode(status) == 0, "expected WriteFailed naming the destination"
        assert list(folder.iterdir()) == []
    finally:
        base.chmod(0o755)
        shutil.rmtree(base)


# ------------------------------------------------------------------ determinism
_ALL_SAMPLES = textwrap.dedent("""
    import sys
    from pathlib import Path
    import graphopt
    out = Path(sys.argv[1])
    for src in sys.argv[2:]:
        graphopt.optimize(src, gpu="none", output=out / Path(src).name)
""")


def test_output_is_byte_identical_across_runs_and_hash_seeds(tmp_path):
    """Fresh interpreters with different PYTHONHASHSEED values (set and dict order of str keys
    change), then the CLI in forked children: every sample model comes out as the same bytes."""
    script = tmp_path / "all.py"
    script.write_text(_ALL_SAMPLES)
    outputs: dict[str, set[bytes]] = {}
    for seed in ("0", "1", "4242"):
        d = tmp_path / f"seed{seed}"
        d.mkdir()
        r = subprocess.run([sys.executable, str(script), str(d), *map(str, SAMPLES)], cwd=d, env=_env(PYTHONHASHSEED=seed),
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        for src in SAMPLES:
            outputs.setdefault(src.name, set()).add((d / src.name).read_bytes())
    again = tmp_path / "cli"
    again.mkdir()
    runs = run_many([(["optimize", src, "--gpu", "none", "-q", "-o", again / src.name], again) for src in SAMPLES], tmp_path)
    for src, r in zip(SAMPLES, runs):
        assert r.returncode == 0, r.stderr
        outputs[src.name].add((again / src.name).read_bytes())
    assert set(outputs) == {p.name for p in SAMPLES}
    for name, variants in outputs.items():
        assert len(variants) == 1, f"{name}: {len(variants)} different outputs"


# ------------------------------------------------------------------ > 2 GB goes to external data
def _model_with_weights(n_bytes: int) -> onnx.ModelProto:
    m = conv_relu()
    big = np.arange(n_bytes // 4, dtype=np.float32)
    m.graph.initializer.append(onnx.numpy_helper.from_array(big, "big"))
    return m


def test_threshold_is_below_the_protobuf_limit():
    assert DEFAULT_EXTERNAL_THRESHOLD < PROTOBUF_LIMIT


@pytest.mark.parametrize("n_bytes, external", [(4_000, False), (400_000, True)])
def test_models_over_the_threshold_are_written_with_external_data(tmp_path, n_bytes, external):
    threshold = 100_000  # stands in for the 2 GB limit
    m = _model_with_weights(n_bytes)
    out = tmp_path / "o.onnx"
    save_model(m, out, size_threshold=threshold)
    data = tmp_path / "o.onnx.data"
    assert data.exists() == external
    assert out.stat().st_size < threshold
    assert sorted(p.name for p in tmp_path.iterdir()) == (["o.onnx", "o.onnx.data"] if external else ["o.onnx"])
    loaded = onnx.load(str(out))  # onnx reads the data file back
    back = {t.name: onnx.numpy_helper.to_array(t) for t in loaded.graph.initializer}
    np.testing.assert_array_equal(back["big"], np.arange(n_bytes // 4, dtype=np.float32))
    stored = onnx.load(str(out), load_external_data=False)
    big = next(t for t in stored.graph.initializer if t.name == "big")
    assert (big.data_location == onnx.TensorProto.EXTERNAL) == external


def test_external_data_write_failure_leaves_neither_file(tmp_path):
    """The data file is written first; if the model file then fails, the destination stays absent
    (a leftover data file without a model is harmless, but there is no half-written model)."""
    m = _model_with_weights(400_000)
    out = tmp_path / "o.onnx"
    out.mkdir()  # the model file cannot replace a folder
    with pytest.raises(WriteFailed):
        save_model(m, out, size_threshold=100_000)
    assert out.is_dir() and list(out.iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
