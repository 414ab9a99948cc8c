"""Configuration: precedence of the sources and what each bad value says."""
import logging
import re

import pytest
import yaml
from absl import flags

from tfsyncmodes import cluster, config
from tfsyncmodes.errors import ConfigError


@pytest.fixture
def parsed_flags():
    """Parses a command line into absl's FLAGS for one test, then restores them."""
    import tfsyncmodes.flags  # noqa: F401

    def parse(*argv):
        flags.FLAGS.unparse_flags()
        flags.FLAGS(["prog", *argv])

    yield parse
    flags.FLAGS.unparse_flags()


def write_yaml(tmp_path, data, name="c.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(path)


def test_defaults_when_nothing_is_given():
    resolved = config.resolve(environ={}, use_flags=False)
    assert (resolved.mode, resolved.backend, resolved.collective_timeout) == ("sync", "auto", 300.0)
    assert set(resolved.sources.values()) == {"default"}


def test_precedence_default_file_environment_flag(tmp_path, parsed_flags):
    path = write_yaml(tmp_path, {"mode": "hybrid", "backend": "mirrored", "collective_timeout": 60})
    env = {"TFSYNC_CONFIG": path, "TFSYNC_MODE": "async", "TFSYNC_COLLECTIVE_TIMEOUT": "30"}

    parsed_flags()
    resolved = config.resolve(environ=env)
    assert (resolved.mode, resolved.backend, resolved.collective_timeout) == ("async", "mirrored", 30.0)
    assert resolved.sources["backend"] == f"config file {path}"
    assert resolved.sources["mode"] == "environment"

    parsed_flags("--sync_mode=sync")
    resolved = config.resolve(environ=env)
    assert resolved.mode == "sync" and resolved.sources["mode"] == "flag"
    assert re.search(r"\n  mode +\= 'sync' +\(flag\)\n", resolved.describe()), resolved.describe()


def test_config_flag_beats_config_environment_variable(tmp_path, parsed_flags):
    by_env = write_yaml(tmp_path, {"backend": "mirrored"}, "env.yaml")
    by_flag = write_yaml(tmp_path, {"backend": "multi_worker"}, "flag.yaml")
    parsed_flags(f"--sync_config={by_flag}")
    assert config.resolve(environ={"TFSYNC_CONFIG": by_env}).backend == "multi_worker"


def test_shipped_config_files_are_the_knob_table(caplog):
    """configs/<mode>.yaml is what tfsyncmodes.config_files renders from KNOBS (regenerate with
    python -m tfsyncmodes.config_files configs): every knob the mode uses, at its shipped
    default; loading one gives the mode's defaults and warns about nothing."""
    import os

    from tfsyncmodes import config_files, knobs

    root = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs")
    assert sorted(os.listdir(root)) == sorted(f"{mode}.yaml" for mode in config_files.MODES)
    defaults = {mode: config.resolve({"mode": mode}, environ={}, use_flags=False) for mode in config_files.MODES}
    for mode in config_files.MODES:
        path = os.path.join(root, f"{mode}.yaml")
        with open(path, encoding="utf-8") as handle:
            assert handle.read() == config_files.render(mode), f"{path} drifted from the knob table"
        # Knobs the defaults leave without effect are listed commented out ("# topk_ratio: 0.01").
        entries = re.findall(r"^(?:# )?(\w+: .*)$", config_files.render(mode), re.M)
        listed = yaml.safe_load("\n".join(e for e in entries if e.split(":")[0] in knobs.KNOBS_BY_KEY))
        assert set(listed) == {k.key for k in knobs.KNOBS if k.used_by(mode)}
        assert all(listed[key] == getattr(defaults[mode], key) for key in listed if key != "mode"), mode
        caplog.clear()
        resolved = config.resolve(environ={"TFSYNC_CONFIG": path}, use_flags=False)
        assert config.knob_values(resolved) == config.knob_values(defaults[mode])
        assert not [r for r in caplog.records if "has no effect" in r.getMessage()], mode


def test_config_is_immutable():
    resolved = config.resolve(environ={}, use_flags=False)
    with pytest.raises(Exception):
        resolved.mode = "async"


@pytest.mark.parametrize("environ, words", [
    ({"TFSYNC_MODE": "bogus"}, ["environment", "TFSYNC_MODE", "sync, async, hybrid"]),
    ({"TFSYNC_BACKEND": "nccl"}, ["TFSYNC_BACKEND", "auto, horovod, multi_worker, mirrored"]),
    ({"TFSYNC_COLLECTIVE_TIMEOUT": "-1"}, ["TFSYNC_COLLECTIVE_TIMEOUT", "out of range", "[1, 86400]"]),
    ({"TFSYNC_COLLECTIVE_TIMEOUT": "soon"}, ["TFSYNC_COLLECTIVE_TIMEOUT", "not a number"]),
    ({"TFSYNC_CONFIG": "/nonexistent/sync.yaml"}, ["environment: TFSYNC_CONFIG: /nonexistent/sync.yaml does not exist"]),
])
def test_bad_environment_values_name_source_field_and_fix(environ, words):
    with pytest.raises(ConfigError) as raised:
        config.resolve(environ=environ, use_flags=False)
    for word in words:
        assert word in str(raised.value)


@pytest.mark.parametrize("text, words", [
    ("mode: [unclosed", ["does not parse", "line 1"]),
    ("moed: sync\n", ["moed", "unknown key", "mode, backend"]),
    ("- sync\n", ["must be a mapping"]),
    ("mode: sideways\n", ["config file", "mode", "sync, async, hybrid"]),
])
def test_bad_config_files(tmp_path, text, words):
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError) as raised:
        config.resolve(environ={"TFSYNC_CONFIG": path}, use_flags=False)
    for word in words:
        assert word in str(raised.value)


def test_bad_flag_value_names_the_flag(parsed_flags):
    # absl parses the flag with the knob's parser: the error it raises carries the ConfigError
    # (tfsyncmodes.run prints that one line, tests/test_cli_errors.py).
    with pytest.raises(flags.IllegalFlagValueError) as raised:
        parsed_flags("--sync_mode=fast")
    assert isinstance(raised.value.__context__, ConfigError)
    assert str(raised.value.__context__) == ("flag: --sync_mode: 'fast' is not accepted; "
                                             "use one of: sync, async, hybrid, auto")


def test_flags_are_typed_and_a_boolean_is_negated_with_no(parsed_flags):
    parsed_flags("--nosync_error_feedback", "--sync_group_size=4", "--sync_max_staleness=0", "--sync_clip_norm=2.5",
                 "--sync_compression=topk", "--sync_mode=hybrid")
    assert (flags.FLAGS.sync_error_feedback, flags.FLAGS.sync_group_size) == (False, 4)
    resolved = config.resolve(environ={})
    assert (resolved.error_feedback, resolved.group_size, resolved.max_staleness, resolved.clip_norm) == (False, 4, 0, 2.5)
    assert resolved.sources["error_feedback"] == "flag"
    parsed_flags("--sync_error_feedback=false", "--sync_group_size=host")
    assert (flags.FLAGS.sync_error_feedback, flags.FLAGS.sync_group_size) == (False, "host")
    parsed_flags("--sync_staleness_aware_lr")
    assert flags.FLAGS.sync_staleness_aware_lr is True
    with pytest.raises(flags.UnrecognizedFlagError):  # absl puts "no" before the whole name
        parsed_flags("--sync_noerror_feedback")


def test_config_file_may_not_name_a_knob_twice(tmp_path):
    path = write_yaml(tmp_path, "topk_ratio: 0.1\nsync_topk_ratio: 0.2\n")
    with pytest.raises(ConfigError, match="topk_ratio, sync_topk_ratio: name the same knob; keep one of them"):
        config.resolve(environ={"TFSYNC_CONFIG": path}, use_flags=False)


@pytest.mark.parametrize("text, words", [
    ("{not json", ["TF_CONFIG", "not valid JSON"]),
    ('["worker"]', ["must be a JSON object"]),
    ('{"task": {"type": "worker", "index": 0}}', ["cluster", "missing or empty"]),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}}', ["task", "missing"]),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "worker", "index": 2}}',
     ["task.index", "out of range", "0..0"]),
    ('{"cluster": {"worker": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 0}}',
     ["task.type", "'ps' is not a role"]),
    ('{"cluster": {"boss": ["127.0.0.1:1"]}, "task": {"type": "boss"}}', ["cluster.boss", "unknown role"]),
    ('{"cluster": {"worker": "127.0.0.1:1"}, "task": {"type": "worker"}}', ["list of 'host:port'"]),
    ('{"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:1"]}, "task": {"type": "worker"}}',
     ["worker[1]", "also worker[0]"]),
    ('{"cluster": {"chief": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "chief"}}',
     ["at most one chief"]),
])
def test_malformed_tf_config(text, words):
    with pytest.raises(ConfigError) as raised:
        cluster.tf_config({"TF_CONFIG": text})
    for word in words:
        assert word in str(raised.value)


def test_tf_config_roles_and_chief():
    parsed = cluster.tf_config({"TF_CONFIG": '{"cluster": {"chief": ["127.0.0.1:1"], '
                                              '"worker": ["127.0.0.1:2", "127.0.0.1:3"]}, '
                                              '"task": {"type": "worker", "index": 1}}'})
    assert parsed.num_workers == 3 and not parsed.is_chief
    with pytest.raises(ConfigError, match="needs at least one 'ps'"):
        parsed.require_roles("async", allowed=("chief", "worker", "ps"), required=("ps",))
    assert cluster.tf_config({}) is None


def test_horovod_environment():
    env = cluster.horovod_env({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
                               "HOROVOD_LOCAL_SIZE": "2"})
    assert (env.rank, env.size, env.local_rank, env.local_size) == (1, 4, 1, 2)
    assert cluster.horovod_env({}) is None
    with pytest.raises(ConfigError, match="HOROVOD_RANK"):
        cluster.horovod_env({"HOROVOD_RANK": "5", "HOROVOD_SIZE": "4"})


@pytest.mark.parametrize("names", [
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")], ids=["open-mpi", "mpich"])
def test_mpirun_environments_give_the_rank_and_size(names):
    """Under ``horovodrun --mpi`` (or ``mpirun``) the coordinates come from Open MPI's or
    MPICH's variables; a local size left out is the world's; a bad value names its variable."""
    rank, size, local_rank, local_size = names
    env = cluster.horovod_env({rank: "3", size: "8", local_rank: "1", local_size: "4"})
    assert (env.rank, env.size, env.local_rank, env.local_size) == (3, 8, 1, 4)
    env = cluster.horovod_env({rank: "2", size: "3"})
    assert (env.rank, env.size, env.local_rank, env.local_size) == (2, 3, 0, 3)
    with pytest.raises(ConfigError, match=size):
        cluster.horovod_env({rank: "0", size: "four"})
    with pytest.raises(ConfigError, match=rank):
        cluster.horovod_env({rank: "8", size: "8"})
    # horovodrun's own variables win over the MPI launcher's
    env = cluster.horovod_env({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", rank: "3", size: "8"})
    assert (env.rank, env.size) == (1, 2)


def test_a_misspelled_variable_is_named_with_the_knobs_it_is_close_to(caplog):
    caplog.set_level(logging.WARNING)
    environ = {"TFSYNC_MDOE": "async", "TFSYNC_COLLECTIVE_TIMEOUTS": "5", "TFSYNC_PERIOD": "4",
               "TFSYNC_VENV": "/somewhere", "TFSYNC_BUILD_KERNELS": "0"}
    resolved = config.resolve(environ=environ, use_flags=False)
    assert (resolved.mode, resolved.period) == ("sync", 4)  # the typo is not read; the knob is
    lines = [r.getMessage() for r in caplog.records if "is not one of the knobs'" in r.getMessage()]
    assert lines == [
        "tfsyncmodes: environment variable TFSYNC_COLLECTIVE_TIMEOUTS is not one of the knobs' and is ignored; "
        "did you mean TFSYNC_COLLECTIVE_TIMEOUT?",
        "tfsyncmodes: environment variable TFSYNC_MDOE is not one of the knobs' and is ignored; "
        "did you mean TFSYNC_MODE?"]  # the package's other variables (TFSYNC_VENV, ...) pass
