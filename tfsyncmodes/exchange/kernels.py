"""The compiled kernels (Top-K, quantization, packed indices): where they are found, their build
on first use, and the one load per process.

``scripts/install.sh`` compiles ``native/*.cc`` into one library next to their sources. A
``pip install`` user has only the sources (they ship as package data), so the first process
that asks for the kernels compiles them with the C++ compiler (``$CXX``, else ``g++``) and
TensorFlow's own compile and link flags into a cache kept per TensorFlow version and per
digest of the sources::

    $TFSYNC_CACHE_DIR  (else $XDG_CACHE_HOME/tfsyncmodes, else ~/.cache/tfsyncmodes)
        tf-2.21.0/<digest>/_tfsync_ops.so           (the first 16 hex digits of the sources' SHA-256)
        tf-2.21.0/<digest>/_tfsync_ops.so.sources   (the whole digest)

A library is stamped with the digest of the sources it was built from; one whose stamp is not
these sources' (an earlier version's) is not used, and the install's then gives way to the
cache's. A library without one of the ops these sources register is not loaded either. Ranks
that start together build once: the build holds a file lock, and the library appears under its
final name only when complete. ``TFSYNC_BUILD_KERNELS=0`` turns the build off; when it is off,
or fails (no compiler, no headers), :func:`locate` says why and the compressors use TensorFlow
ops (the same result, slower). The build turns off floating-point contraction: a fused
multiply-add rounds once where the quantization rule rounds twice.
"""
from __future__ import annotations

import fcntl
import functools
import glob
import hashlib
import os
import shlex
import subprocess
import tempfile
from typing import Optional, Tuple

import tensorflow as tf

NATIVE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native")
SOURCES = tuple(sorted(glob.glob(os.path.join(NATIVE_DIR, "*.cc"))))  # as scripts/install.sh compiles them
HEADERS = tuple(sorted(glob.glob(os.path.join(NATIVE_DIR, "*.h"))))
OPS = ("tfsync_top_k_magnitude", "tfsync_scatter_dense", "tfsync_quantize", "tfsync_dequantize",
       "tfsync_pack_indices", "tfsync_unpack_indices")  # what a library of these sources registers
LIBRARY = "_tfsync_ops.so"
DIGEST = ".sources"  # next to a library: the digest of the sources it was built from
IMPLEMENTATIONS = ("auto", "native", "ops")
BUILD_TIMEOUT_S = 600


def cache_dir() -> str:
    """Where kernels built on first use are kept: a folder per TensorFlow version and, in it,
    per digest of the sources, so that installs of different versions sharing a cache never
    overwrite each other's library."""
    root = os.environ.get("TFSYNC_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "tfsyncmodes")
    return os.path.join(root, f"tf-{tf.__version__}", (sources_digest() or "sources-unknown")[:16])


def sources_digest(sources: Tuple[str, ...] = SOURCES + HEADERS) -> Optional[str]:
    """The SHA-256 of `sources` (None when one is missing: nothing to compare a library with)."""
    digest = hashlib.sha256()
    for source in sources:
        try:
            with open(source, "rb") as text:
                digest.update(text.read())
        except OSError:
            return None
    return digest.hexdigest()


def current(library: str) -> bool:
    """Whether `library` exists and was built from these sources (or they cannot be read)."""
    if not os.path.exists(library):
        return False
    want = sources_digest()
    try:
        with open(library + DIGEST) as stamp:
            return want is None or stamp.read().strip() == want
    except OSError:
        return want is None


def build(output: str, sources: Tuple[str, ...] = SOURCES) -> Tuple[bool, str]:
    """Compiles `sources` into the shared library `output`, stamped with their digest; (done,
    the compiler's last words)."""
    compiler = os.environ.get("CXX") or "g++"
    command = ([*shlex.split(compiler), "-O3", "-ffp-contract=off", "-shared", "-fPIC", "-w", "-o", output + ".tmp",
                *sources]
               + tf.sysconfig.get_compile_flags() + tf.sysconfig.get_link_flags())
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as error:
        return False, f"{compiler} did not run: {error}"
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])
        return False, f"{compiler} failed: {tail}"
    os.replace(output + ".tmp", output)
    with open(output + DIGEST, "w") as stamp:  # after the library: a library never looks newer than it is
        stamp.write((sources_digest(sources + HEADERS) or "") + "\n")
    return True, ""


def locate(prebuilt: Optional[str] = os.path.join(NATIVE_DIR, LIBRARY),
           cache: Optional[str] = None) -> Tuple[Optional[str], str]:
    """(the library's path, how it was found) or (None, why there is none): the library
    ``scripts/install.sh`` built, else the one in the cache, else a build into the cache."""
    if prebuilt and current(prebuilt):
        return prebuilt, "built at install"
    folder = cache or cache_dir()
    library = os.path.join(folder, LIBRARY)
    if current(library):
        return library, "built on first use"
    if os.environ.get("TFSYNC_BUILD_KERNELS", "1") == "0":
        return None, "TFSYNC_BUILD_KERNELS=0"
    missing = [source for source in SOURCES if not os.path.exists(source)]
    if missing:
        return None, f"no source at {missing[0]}"
    try:
        os.makedirs(folder, exist_ok=True)
        with open(library + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # another rank may be building it
            if current(library):
                return library, "built on first use"
            with tempfile.TemporaryDirectory(dir=folder) as scratch:
                done, why = build(os.path.join(scratch, LIBRARY))
                if not done:
                    return None, why
                os.replace(os.path.join(scratch, LIBRARY), library)
                os.replace(os.path.join(scratch, LIBRARY + DIGEST), library + DIGEST)
    except OSError as error:
        return None, f"cannot build into {folder}: {error}"
    return library, "built on first use, now"


def missing_ops(module) -> list:
    """The ops of :data:`OPS` a loaded library's module does not have."""
    return [op for op in OPS if not hasattr(module, op)]


@functools.lru_cache(maxsize=None)
def load() -> Tuple[Optional[object], str]:
    """(the kernels' module, where it came from) or (None, why there is none). Loaded once per
    process: TensorFlow registers a library's ops once, and a second load (of the same or
    another copy) returns a module without them."""
    library, how = locate()
    if library is None:
        return None, how
    try:
        module = tf.load_op_library(library)
    except (tf.errors.NotFoundError, OSError) as error:  # built for another TensorFlow
        return None, f"{library} does not load: {str(error).splitlines()[0]}"
    missing = missing_ops(module)
    if missing:  # an earlier build whose sources could not be compared
        return None, f"{library} has no {missing[0]} (built from earlier sources: run scripts/install.sh again)"
    return module, f"{library}, {how}"


def choose(implementation: str, part: str):
    """The kernels' module for `implementation` of `part` (a compressor's name, for messages):
    ``auto`` takes them when they are built (or build) and None (TensorFlow ops) otherwise;
    ``ops`` is None; ``native`` without them is an error."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"{part} implementation {implementation!r}: use one of {', '.join(IMPLEMENTATIONS)}")
    module = None if implementation == "ops" else load()[0]
    if implementation == "native" and module is None:
        raise RuntimeError(f"the {part} kernels are not built and could not be: {load()[1]}")
    return module
