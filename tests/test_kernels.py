"""The Top-K kernels for a ``pip install`` user: built on first use into a cache per TensorFlow
version, once, exact against NumPy; a missing compiler or TFSYNC_BUILD_KERNELS=0 falls back to
TensorFlow ops with the reason; and the one log line that says which implementation runs."""
import hashlib
import os
import subprocess
import sys
import types

import numpy as np
import pytest

import tensorflow as tf  # noqa: F401  (a broken TensorFlow must fail these tests, not skip them)

from tests import reference
from tests.conftest import PYTHON, clean_env
from tfsyncmodes.exchange import kernels


@pytest.mark.slow
def test_the_first_use_builds_the_kernels_into_the_cache_once_and_they_are_exact(tmp_path):
    library, how = kernels.locate(prebuilt=None, cache=str(tmp_path))
    assert (library, how) == (str(tmp_path / kernels.LIBRARY), "built on first use, now")
    # No scratch left; the library stamped with its sources' digest.
    assert sorted(os.listdir(tmp_path)) == [kernels.LIBRARY, kernels.LIBRARY + ".lock",
                                            kernels.LIBRARY + kernels.DIGEST]
    assert (tmp_path / (kernels.LIBRARY + kernels.DIGEST)).read_text().strip() == hashlib.sha256(
        b"".join(open(source, "rb").read() for source in kernels.SOURCES + kernels.HEADERS)).hexdigest()
    built = os.stat(library).st_mtime_ns
    assert kernels.locate(prebuilt=None, cache=str(tmp_path)) == (library, "built on first use")
    assert os.stat(library).st_mtime_ns == built  # found, not rebuilt

    # Loaded in a process of its own: TensorFlow registers a library's ops once per process,
    # and this one may already hold the copy the install built.
    flat = np.random.default_rng(3).standard_normal(300_000).astype(np.float32)
    np.save(tmp_path / "flat.npy", flat)
    code = ("import sys, numpy as np, tensorflow as tf\n"
            "module = tf.load_op_library(sys.argv[1])\n"
            "flat = np.load(sys.argv[2])\n"
            "values, indices = module.tfsync_top_k_magnitude(tf.constant(flat), k=3000)\n"
            "np.save(sys.argv[3], np.stack([indices.numpy().astype(np.float64), values.numpy()]))\n")
    done = subprocess.run([sys.executable, "-c", code, library, str(tmp_path / "flat.npy"), str(tmp_path / "out.npy")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr
    indices, values = np.load(tmp_path / "out.npy")
    indices = indices.astype(np.int64)
    _, want = reference.topk_compress(flat, 0.01)
    assert sorted(indices.tolist()) == sorted(want.tolist())
    np.testing.assert_array_equal(values.astype(np.float32), flat[indices])


def test_the_cache_is_per_tensorflow_version_and_sources_under_the_users_cache(monkeypatch, tmp_path):
    digest = hashlib.sha256(b"".join(open(source, "rb").read()
                                     for source in kernels.SOURCES + kernels.HEADERS)).hexdigest()[:16]
    assert {os.path.basename(source) for source in kernels.SOURCES} >= {"topk_ops.cc", "quantize_ops.cc",
                                                                          "index_ops.cc"}
    monkeypatch.delenv("TFSYNC_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert kernels.cache_dir() == str(tmp_path / "tfsyncmodes" / f"tf-{tf.__version__}" / digest)
    monkeypatch.setenv("TFSYNC_CACHE_DIR", str(tmp_path / "mine"))
    assert kernels.cache_dir() == str(tmp_path / "mine" / f"tf-{tf.__version__}" / digest)


def test_a_library_built_from_other_sources_is_not_used(tmp_path):
    """An install's or a cache's library from an earlier version of the sources (a new kernel
    missing) gives way: the install's to the cache's, the cache's to a build."""
    digest = kernels.sources_digest()
    installed, cache = tmp_path / "installed.so", tmp_path / "cache"
    cache.mkdir()
    installed.write_bytes(b"an earlier build")
    assert not kernels.current(str(installed))  # no digest: not known to be these sources'
    (tmp_path / ("installed.so" + kernels.DIGEST)).write_text("0" * 64 + "\n")
    assert not kernels.current(str(installed))
    (cache / kernels.LIBRARY).write_bytes(b"a build of these sources")
    (cache / (kernels.LIBRARY + kernels.DIGEST)).write_text(digest + "\n")
    assert kernels.locate(prebuilt=str(installed), cache=str(cache)) == (str(cache / kernels.LIBRARY),
                                                                       "built on first use")
    (tmp_path / ("installed.so" + kernels.DIGEST)).write_text(digest + "\n")
    assert kernels.locate(prebuilt=str(installed), cache=str(cache)) == (str(installed), "built at install")


def test_a_library_without_one_of_the_ops_is_not_taken():
    """The install's library has every op these sources register; one built before a kernel
    was added lacks it, and load() turns such a library down with its name (not a crash when a
    compressor first calls the op)."""
    module, how = kernels.load()
    assert module is not None and kernels.missing_ops(module) == [], how
    earlier = types.SimpleNamespace(tfsync_top_k_magnitude=None, tfsync_scatter_dense=None,
                                    tfsync_quantize=None, tfsync_dequantize=None)
    assert kernels.missing_ops(earlier) == ["tfsync_pack_indices", "tfsync_unpack_indices"]


def test_without_a_compiler_or_with_the_build_off_there_is_no_library_and_the_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    library, why = kernels.locate(prebuilt=None, cache=str(tmp_path / "cache"))
    assert library is None and "no-such-compiler did not run" in why
    assert not os.path.exists(tmp_path / "cache" / kernels.LIBRARY)
    monkeypatch.setenv("TFSYNC_BUILD_KERNELS", "0")
    assert kernels.locate(prebuilt=None, cache=str(tmp_path / "cache")) == (None, "TFSYNC_BUILD_KERNELS=0")


def test_one_log_line_says_which_implementation_runs(tmp_path):
    """The checkout's install built the kernels; two compressors log the line once."""
    code = ("from absl import app\n"
            "from tfsyncmodes.exchange.compressors import TopK\n"
            "app.run(lambda argv: len([TopK(), TopK()]) and None)\n")
    (tmp_path / "two_topk.py").write_text(code)
    done = subprocess.run([PYTHON, str(tmp_path / "two_topk.py")], capture_output=True, text=True, timeout=120,
                          env=clean_env())
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "Top-K runs" in line]
    assert len(lines) == 1, done.stderr
    assert "tfsyncmodes: Top-K runs the compiled kernels" in lines[0] and "built at install" in lines[0]
