"""The registries: built-in parts declared as name -> "module:attribute", so that their names
are known (to the flags, the knobs' parsers) without importing the parts, and what a registry
holds does not depend on what was imported before."""
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, clean_env
from tfsyncmodes import registry
from tfsyncmodes.errors import ConfigError


def test_registries_know_their_built_in_names_without_importing_them():
    script = ("import os, sys, types\n"
              "pkg = types.ModuleType('tfsyncmodes'); pkg.__path__ = [os.path.join(os.getcwd(), 'tfsyncmodes')]\n"
              "sys.modules['tfsyncmodes'] = pkg\n"
              "import tfsyncmodes.flags, tfsyncmodes.config\n"
              "from tfsyncmodes import registry\n"
              "print(registry.MODES.names(), registry.COMPRESSORS.names(), registry.CROSS_GROUP.names())\n"
              "print(sorted(m for m in sys.modules if m.startswith(('tensorflow', 'keras', 'horovod', "
              "'tfsyncmodes.strategies', 'tfsyncmodes.exchange', 'tfsyncmodes.switching', 'tfsyncmodes.keras'))))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=100, cwd=REPO,
                            env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["('sync', 'async', 'hybrid', 'auto') ('none', 'fp16', 'topk', 'int8', 'int4', 'int2', "
                                          "'topk_int8', 'topk_int4', 'topk_int2') "
                                          "('stale', 'periodic', 'elastic')", "[]"]


def test_every_built_in_entry_is_the_part_its_module_registers():
    for reg in (registry.MODES, registry.BACKENDS, registry.COMPRESSORS, registry.MEMORIES, registry.CROSS_GROUP,
                registry.OUTER_OPTIMIZERS, registry.SWITCH_PLANS):
        for name, where in reg._builtins.items():
            part = reg.get(name)
            assert f"{part.__module__}:{part.__qualname__}" == where, (reg.kind, name)
    with pytest.raises(ValueError, match="'topk' is the built-in compression"):
        registry.COMPRESSORS.register("topk")(type("Mine", (), {}))
    user = registry.Registry("thing", {"a": "os.path:join"})
    user.register("b")(len)
    assert user.names() == ("a", "b") and user.get("a") is os.path.join and user.get("b") is len
    with pytest.raises(ConfigError, match="use one of: a, b"):
        user.get("c")
