#!/usr/bin/env bash
# Installs tfsyncmodes into a virtual environment, with Horovod built for the installed
# TensorFlow. Idempotent: a second run finds everything in place and takes seconds.
#
#   scripts/install.sh            # venv at ./.venv (override with TFSYNC_VENV=DIR)
#   TFSYNC_TENSORFLOW=gpu scripts/install.sh   # the `tensorflow` build instead of `tensorflow-cpu`
#
# TensorFlow comes from the package's `cpu` extra (tensorflow-cpu, the default here) or its
# `gpu` extra (tensorflow; Horovod is then built with NCCL, untested here: no GPU in CI).
# The `examples` extra adds scikit-learn for scripts/train.py's digits.
#
# Horovod 0.28.1 ships only as an sdist. Against TF 2.21 its XLA op file does not compile,
# so the build drops horovod/tensorflow/xla_mpi_ops.cc from TF_SOURCES (XLA is off on the
# Horovod path anyway) and builds with Gloo, without MPI. It also applies
# scripts/horovod-0.28.1.patch: a collective queued after Horovod's background loop has shut
# down (a lost peer) was never run nor failed, so its step never ended; the patched queue refuses
# it with Horovod's shut-down error, which an elastic job answers with a rollback. The wheel is
# cached under ${TFSYNC_CACHE:-~/.cache/tfsyncmodes}, per TensorFlow version and patch, and
# reused by later installs on the same machine.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${TFSYNC_VENV:-$repo/.venv}
cache=${TFSYNC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tfsyncmodes}
horovod_version=0.28.1
horovod_patch=$repo/scripts/horovod-$horovod_version.patch
horovod_patch_name=tensor-queue-finalized  # what the patched horovod/__init__.py lists
python=${PYTHON:-python3}
flavour=${TFSYNC_TENSORFLOW:-cpu}

say() { printf '[install] %s\n' "$*" >&2; }
die() { printf '[install] ERROR: %s\n' "$*" >&2; exit 1; }

case "$flavour" in
  cpu) tf_distribution=tensorflow-cpu ;;
  gpu) tf_distribution=tensorflow ;;
  *) die "TFSYNC_TENSORFLOW=$flavour: use cpu (tensorflow-cpu) or gpu (tensorflow)" ;;
esac

if [ ! -x "$venv/bin/python" ]; then
  say "creating virtual environment $venv"
  "$python" -m venv "$venv" || die "could not create a venv with $python (install python3-venv)"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

# A run that completed records what it installed; the same inputs again need no pip at all.
stamp="$venv/.tfsyncmodes-install"
native="$repo/tfsyncmodes/exchange/native"
ops_lib="$native/_tfsync_ops.so"
inputs=$( (cat "$repo/pyproject.toml" "${BASH_SOURCE[0]}" "$horovod_patch" "$repo/tfsyncmodes/exchange/kernels.py" "$native"/*.cc "$native"/*.h; echo "$flavour") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$inputs" ] && [ -f "$ops_lib" ] \
    && "$venv/bin/python" -c 'import horovod.tensorflow, tfsyncmodes' >/dev/null 2>&1; then
  say "already installed in ${venv#$repo/} (delete $stamp to force a reinstall)"
  exit 0
fi
rm -f "$stamp"

say "installing tfsyncmodes with $tf_distribution, the examples' and the tests' dependencies, and tf-keras"
"${pip[@]}" install -e "$repo[$flavour,examples,test]" || die "pip could not install tfsyncmodes' dependencies"
# tf-keras requires the full 'tensorflow' distribution; tensorflow-cpu provides the same module.
"${pip[@]}" install --no-deps "tf-keras==2.21.*" || die "pip could not install tf-keras"

horovod_ok() {
  "$venv/bin/python" - "$horovod_version" "$horovod_patch_name" <<'PY' >/dev/null 2>&1
import sys
import horovod
import horovod.tensorflow as hvd
assert horovod.__version__ == sys.argv[1]
assert sys.argv[2] in getattr(horovod, "tfsyncmodes_patches", ())
assert hvd.gloo_built()
PY
}

build_horovod_wheel() {
  local work
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  say "building Horovod $horovod_version from its sdist (about 6 minutes on 2 cores)"
  "${pip[@]}" install "cmake<4" packaging psutil cloudpickle || die "could not install Horovod's build tools"
  "${pip[@]}" download --no-deps --no-binary :all: "horovod==$horovod_version" -d "$work" \
    || die "could not download the Horovod $horovod_version sdist"
  tar -xzf "$work/horovod-$horovod_version.tar.gz" -C "$work"
  local src="$work/horovod-$horovod_version"
  local gpu_env=()
  if [ "$flavour" = gpu ]; then gpu_env=(HOROVOD_GPU_OPERATIONS=NCCL); fi
  local cmakelists="$src/horovod/tensorflow/CMakeLists.txt"
  grep -q 'xla_mpi_ops.cc' "$cmakelists" || die "unexpected Horovod sdist: no xla_mpi_ops.cc in $cmakelists"
  sed -i '/TF_SOURCES.*xla_mpi_ops\.cc/d' "$cmakelists"
  git -C "$src" apply "$horovod_patch" || die "could not apply $horovod_patch to the Horovod sdist"
  mkdir -p "$cache"
  if ! env HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
      HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo "${gpu_env[@]}" \
      MAKEFLAGS="-j$(nproc)" \
      "$venv/bin/python" -m pip --disable-pip-version-check wheel --no-build-isolation --no-deps \
        -w "$work/dist" "$src" >"$work/build.log" 2>&1; then
    tail -n 40 "$work/build.log" >&2
    die "the Horovod build failed (last lines above); nothing was installed"
  fi
  cp "$work"/dist/horovod-*.whl "$cache/"
}

if horovod_ok; then
  say "Horovod $horovod_version with TensorFlow and Gloo is already installed"
else
  tag=$("$venv/bin/python" -c 'import sys; print(f"cp{sys.version_info.major}{sys.version_info.minor}")')
  tf_version=$("$venv/bin/python" -c 'import importlib.metadata as m, sys; print(m.version(sys.argv[1]))' \
    "$tf_distribution" 2>/dev/null || echo unknown)
  # The wheel is only valid for the TensorFlow build it was compiled against, and its patch.
  cache="$cache/tf-$tf_version-patch-$(sha256sum "$horovod_patch" | cut -c1-12)"
  if [ "$flavour" = gpu ]; then cache="$cache-gpu"; fi
  wheel=$(ls "$cache"/horovod-"$horovod_version"-"$tag"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    build_horovod_wheel
    wheel=$(ls "$cache"/horovod-"$horovod_version"-"$tag"-*.whl | head -n 1)
  else
    say "reusing the built wheel $(basename "$wheel")"
  fi
  "${pip[@]}" install --force-reinstall --no-deps "$wheel" || die "could not install $wheel"
  "${pip[@]}" install cloudpickle psutil packaging || die "could not install Horovod's dependencies"
  horovod_ok || die "Horovod installed but does not import with TensorFlow and Gloo; remove $cache and rerun"
fi

# Satisfied by the wheel above; keeps the declared extra honest.
"${pip[@]}" install -e "$repo[$flavour,horovod,examples,test]" || die "pip could not resolve the horovod extra"
# check-build probes each framework in a subprocess and can time out while TF imports under
# load; the import check above is authoritative, this shows the build to the user.
for attempt in 1 2 3; do
  if report=$("$venv/bin/horovodrun" --check-build 2>/dev/null) \
      && grep -q '\[X\] TensorFlow' <<<"$report" && grep -q '\[X\] Gloo' <<<"$report"; then
    grep -E '\[X\] (TensorFlow|Gloo)' <<<"$report" | sort -u >&2
    break
  fi
  [ "$attempt" = 3 ] && die "horovodrun --check-build does not show TensorFlow and Gloo"
done
# The compressors' kernels (Top-K and quantization: tfsyncmodes/exchange/native), compiled
# against this TensorFlow like Horovod, by the same function that builds them on first use for
# a pip install (tfsyncmodes/exchange/kernels.py); without them the compressors use TensorFlow
# ops (same result, slower). A library under the name an earlier install used goes.
rm -f "$native/_topk_ops.so"
build_ops() {
  "$venv/bin/python" - "$ops_lib" <<'PY' 2>"$venv/tfsync_ops.log" || { tail -n 5 "$venv/tfsync_ops.log" >&2; return 1; }
import sys
from tfsyncmodes.exchange import kernels
done, why = kernels.build(sys.argv[1])
sys.exit(0 if done else why)
PY
  "$venv/bin/python" -c 'from tfsyncmodes.exchange import kernels; kernels.choose("native", "compressor")' >/dev/null 2>&1
}
say "compiling the compressors' kernels (tfsyncmodes/exchange/native)"
if ! build_ops; then
  rm -f "$ops_lib" "$ops_lib.tmp"
  say "WARNING: the compressors' kernels did not build; Top-K and the quantizers use TensorFlow ops (slower)"
fi
echo "$inputs" >"$stamp"
say "done: activate with 'source ${venv#$repo/}/bin/activate'"
