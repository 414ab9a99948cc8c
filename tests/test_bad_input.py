"""Bad input caught before TensorFlow sees it: one line naming source, field and fix, exit
status 2, no traceback.

What was tried, for every input (here unless another file is named; "by hand": run once with
scripts/train.py, one line and exit 2 seen, not repeated in CI because the path is the same as a
tested one):

scripts/train.py's own flags
  --epochs               0, abc (absl's parser: the same path serves every typed flag)
  --batch_size           0 (smaller than the replicas: train.py checks it, not tried here)
  --learning_rate        -1, nan; inf (at_least: test_numeric_flags_refuse_nan_and_infinity)
  --dataset              bogus (by hand: absl's enum)
  --synthetic_samples    10 with --dataset=synthetic (by hand)
  --synthetic_features   0 (by hand; the same at_least loop as --hidden_units)
  --hidden_units         0
  --model_dir            a file, a path inside a file (and '' through tfsyncmodes.paths)
  --seed                 -1 (a traceback from NumPy before); 2**32 (the same check)
  --metrics_file         a path inside a file
  --model, --data        nomodule:f, x (not module:function) (by hand)
  --compute_ms           -5 (ran, now refused), nan (at_least)
  --compute_slow_worker  1:4:5:5 (an empty window); abc, 1:0.5, 1:4:5 (tests/test_emulated_compute.py)
  --compute_jitter       weibull:1; pareto:1, lognormal:0, nan (tests/test_emulated_compute.py)
  absl's own (--verbosity, --logtostderr, ...)  an unknown flag (--no_such_flag)
tfsyncmodes' flags = TFSYNC_* variables = config-file keys (one parser per knob; every knob has
  its bad values in BAD_KNOB_VALUES, swept in one process through all four sources by
  test_every_knob_refuses_bad_values_from_every_source; test_every_knob_has_bad_values fails for
  a knob without, or without its parser kind's values (BAD_BY_PARSER)): numbers abc, -1e30, 1e30, nan,
  inf, true, out of their bounds, 2.5 for integers; the old numeric sentinels (clip_norm 0,
  max_staleness -1, group_size 0, outer_lr 0, local_steps 3, ...: tests/test_knobs.py names the
  word each one says to use); booleans maybe, 2; choices bogus; --sync_mode_schedule bogus,
  sync:150%; --sync_groups 0,1;1, a, 0;;1; --sync_slow_worker x, 1:0.5, -1:2. Through the command
  line: tests/test_cli_errors.py (--sync_mode, --sync_backend, --sync_config missing,
  horovod/multi_worker without their launcher, --sync_ps_shards under Keras 3, an old sentinel),
  tests/test_config.py (sources and precedence, typed flags); config files: several unknown keys
  at once, flag names as keys, one knob named twice; --sync_compression under the tf.distribute
  backends.
TF_CONFIG
  (json)       not JSON, a list, a string (tests/test_cli_errors.py, by hand)
  cluster      missing, empty, a list; a role that is unknown, not a list, an empty list, a list
               of non-strings; two chiefs; a role given twice (tests/test_cli_errors.py)
  addresses    port abc, 0, 65536; no host; unbracketed IPv6; the same address twice
               ([::1]:2222, host names and 10.0.0.1:1 accepted)
  task         missing, a list, no type; type not a role of the cluster; index "0", 1.5, true,
               -1, beyond the role (tests/test_cli_errors.py); index left out is 0, as in TF
  rpc_layer    grpc+verbs (only grpc is served); environment: any value (TF ignores it)
  roles per mode  ps under sync, no ps / no worker under async (tests/test_cli_errors.py)
python -m tfsyncmodes.launch (test_bad_launcher_options_are_one_line_with_status_2)
  --workers    abc, 0, no value          --ps        -1, 1.5
  --timeout    abc, -5, nan; with --print-tf-config
  --tolerate_worker_loss, --share_network   =yes / =1; with --print-tf-config
  --hosts      without --print-tf-config; with it: missing, '', a,,b, a:2222, a,a (test_deploy.py)
  --port       without --print-tf-config; with it: 0, 65534 (no room for the tasks), http
  --print-tf-config  with a command
  command      missing (test_launch.py), not found, not executable (README.md); an unknown
               option (--bogus), an ambiguous prefix (--p)
  Not refused: large --workers/--ps (a local cluster of any size is started as asked).
"""
import json
import os

import pytest

from tests.conftest import COLD_PYTHON, PYTHON, REPO, clean_env, trainer_runs
from tfsyncmodes import cluster, config, knobs
from tfsyncmodes import flags as flag_defs
from tfsyncmodes.knob_types import Boolean, Choice, Number, Text
from tfsyncmodes.errors import ConfigError, at_least
from tfsync_testbed import localrun

TRAIN = os.path.join(REPO, "scripts", "train.py")


def tf_config_with(address):
    return json.dumps({"cluster": {"worker": [address, "127.0.0.1:2223"]}, "task": {"type": "worker", "index": 0}})


@pytest.mark.parametrize("address, words", [
    ("127.0.0.1:abc", ["cluster.worker[0]", "port 'abc'", "1..65535"]),
    ("127.0.0.1:0", ["port '0'", "1..65535"]),
    ("127.0.0.1:65536", ["port '65536'"]),
    (":2222", ["has no valid host"]),
    ("::1:2222", ["has no valid host", "[::1]:2222"]),
])
def test_tf_config_addresses_are_host_and_port(address, words):
    with pytest.raises(ConfigError) as raised:
        cluster.tf_config({"TF_CONFIG": tf_config_with(address)})
    assert str(raised.value).startswith("TF_CONFIG: ")
    for word in words:
        assert word in str(raised.value)


WORKERS = ["127.0.0.1:2222", "127.0.0.1:2223"]


@pytest.mark.parametrize("raw, words", [
    ({"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}, ["cluster.worker", "non-empty list"]),
    ({"cluster": {"worker": "127.0.0.1:2222"}, "task": {"type": "worker"}}, ["cluster.worker", "list of"]),
    ({"cluster": {"worker": [2222]}, "task": {"type": "worker"}}, ["cluster.worker", "'host:port' strings"]),
    ({"cluster": {"worker": WORKERS, "boss": ["127.0.0.1:2224"]}, "task": {"type": "worker"}}, ["cluster.boss"]),
    ({"cluster": {"chief": WORKERS, "worker": ["127.0.0.1:2224"]}, "task": {"type": "worker"}}, ["2 chiefs"]),
    ({"cluster": {"worker": WORKERS}, "task": {"type": "ps", "index": 0}}, ["task.type", "'ps'"]),
    ({"cluster": {"worker": WORKERS}, "task": {"type": "worker", "index": "0"}}, ["task.index", "not an integer"]),
    ({"cluster": {"worker": WORKERS}, "task": {"type": "worker", "index": 1.5}}, ["task.index", "not an integer"]),
    ({"cluster": {"worker": WORKERS}, "task": {"type": "worker", "index": True}}, ["task.index", "not an integer"]),
    ({"cluster": {"worker": WORKERS}, "task": {"type": "worker", "index": -1}}, ["task.index", "use 0..1"]),
    ({"cluster": {"worker": WORKERS}, "task": ["worker", 0]}, ["task: missing"]),
    ({"cluster": {"worker": WORKERS}, "task": {"type": "worker"}, "rpc_layer": "grpc+verbs"}, ["rpc_layer"]),
], ids=lambda value: None)
def test_tf_config_fields(raw, words):
    with pytest.raises(ConfigError) as raised:
        cluster.tf_config({"TF_CONFIG": json.dumps(raw)})
    assert str(raised.value).startswith("TF_CONFIG: ")
    for word in words:
        assert word in str(raised.value)


def test_tf_config_fields_that_are_fine():
    parsed = cluster.tf_config({"TF_CONFIG": json.dumps({"cluster": {"worker": WORKERS}, "task": {"type": "worker"},
                                                         "rpc_layer": "grpc", "environment": "cloud"})})
    assert (parsed.task_type, parsed.task_index) == ("worker", 0)  # index 0 when left out, as in TensorFlow


@pytest.mark.parametrize("address", ["[::1]:2222", "worker-0.svc.cluster.local:2222", "10.0.0.1:1"])
def test_tf_config_addresses_that_are_fine(address):
    assert cluster.tf_config({"TF_CONFIG": tf_config_with(address)}).cluster["worker"][0] == address


def test_config_file_reports_every_unknown_key_and_takes_flag_names(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("sync_mode: hybrid\nsync_backend: horovod\ntopk_ratio: 0.1\nbogus: 1\nalso_bogus: 2\n")
    with pytest.raises(ConfigError) as raised:
        config.resolve(environ={"TFSYNC_CONFIG": str(path)}, use_flags=False)
    assert "bogus, also_bogus" in str(raised.value) and "unknown keys" in str(raised.value)
    path.write_text("sync_mode: hybrid\nsync_backend: horovod\ntopk_ratio: 0.1\n")
    resolved = config.resolve(environ={"TFSYNC_CONFIG": str(path)}, use_flags=False)
    assert (resolved.mode, resolved.backend, resolved.topk_ratio) == ("hybrid", "horovod", 0.1)


def one_clear_error(result):
    assert result.returncode == 2, (result.stdout + result.stderr)[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("tfsyncmodes: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


# Each case a process of its own, forked from one that imported the trainer once
# (conftest.trainer_runs); the TF_CONFIG port below runs scripts/train.py whole.
BAD_TRAIN_FLAGS = [
    (["--epochs=0"], ["flag: --epochs: 0 is too small", ">= 1"]),
    (["--epochs=abc"], ["--epochs=abc", "--helpfull"]),
    (["--no_such_flag=1"], ["no_such_flag"]),
    (["--batch_size=0"], ["--batch_size"]),
    (["--learning_rate=-1"], ["--learning_rate", "positive"]),
    (["--hidden_units=0"], ["--hidden_units"]),
    (["--model_dir=README.md"], ["--model_dir", "README.md is a file"]),
    (["--model_dir=README.md/run"], ["--model_dir", "which is a file"]),
    (["--metrics_file=README.md/out.json"], ["--metrics_file", "README.md is a file"]),
    (["--sync_backend=mirrored", "--sync_compression=fp16"], ["compression", "mirrored backend"]),
    (["--seed=-1"], ["flag: --seed: -1 is out of range", "0..4294967295"]),
    (["--learning_rate=nan"], ["flag: --learning_rate: nan is not a finite number"]),
    (["--compute_jitter=weibull:1"], ["flag: --compute_jitter: 'weibull:1' names no distribution", "pareto:ALPHA"]),
    (["--compute_slow_worker=1:4:5:5"], ["flag: --compute_slow_worker: '1:4:5:5' is not accepted", "FROM < TO"]),
]


@pytest.fixture(scope="module")
def bad_train_flag_runs():
    return trainer_runs({" ".join(args): (args, {}) for args, _ in BAD_TRAIN_FLAGS})


@pytest.mark.timeout(600)
@pytest.mark.xdist_group("bad-train-flags")  # one worker runs the module's sweep once
@pytest.mark.parametrize("args, words", BAD_TRAIN_FLAGS,
                         ids=lambda value: value[0] if isinstance(value, list) else None)
def test_bad_train_flags_are_one_line_with_status_2(args, words, bad_train_flag_runs):
    line = one_clear_error(bad_train_flag_runs[" ".join(args)])
    for word in words:
        assert word in line


@pytest.mark.timeout(200)
def test_tf_config_port_that_is_not_a_number_stops_before_tensorflow():
    env = clean_env(TF_CONFIG=tf_config_with("127.0.0.1:abc"))
    result = localrun.run([PYTHON, TRAIN, "--epochs=1"], timeout=120, env=env, cwd=REPO)
    assert "Could not parse port" not in result.stderr
    assert "port 'abc'" in one_clear_error(result)


# --- python -m tfsyncmodes.launch: every option ------------------------------------------
# The launcher refuses these before it starts a command; the command names the real interpreter,
# whose path (unlike the warm one's) is the same in every pytest process, and so are the test ids.

@pytest.mark.parametrize("argv, words", [
    (["--workers", "abc", "--", COLD_PYTHON], ["launch: --workers: 'abc' is not a whole number"]),
    (["--workers", "0", "--", COLD_PYTHON], ["launch: --workers: 0 is too few", "use 1 or more"]),
    (["--workers"], ["launch: --workers: needs a value"]),
    (["--ps", "-1", "--", COLD_PYTHON], ["launch: --ps: -1 is negative", "use 0 or more"]),
    (["--ps", "1.5", "--", COLD_PYTHON], ["launch: --ps: '1.5' is not a whole number"]),
    (["--timeout", "abc", "--", COLD_PYTHON], ["launch: --timeout: 'abc'", "seconds >= 0"]),
    (["--timeout", "-5", "--", COLD_PYTHON], ["launch: --timeout: '-5'", "seconds >= 0"]),
    (["--timeout", "nan", "--", COLD_PYTHON], ["launch: --timeout: 'nan'"]),
    (["--tolerate_worker_loss=yes", "--", COLD_PYTHON], ["launch: --tolerate_worker_loss: takes no value, got 'yes'"]),
    (["--share_network=1", "--", COLD_PYTHON], ["launch: --share_network: takes no value"]),
    (["--bogus", "--", COLD_PYTHON], ["launch: --bogus: is not an option of the launcher", "--help"]),
    (["--p", "3", "--", COLD_PYTHON], ["launch: --p: ", "could match"]),
    (["--hosts", "a,b", "--", COLD_PYTHON], ["launch: --hosts: is only used with --print-tf-config"]),
    (["--port", "3000", "--", COLD_PYTHON], ["launch: --port: is only used with --print-tf-config"]),
    (["--workers", "2"], ["launch: command: missing", "after --"]),
    (["--", "no_such_program_here"], ["launch: command: 'no_such_program_here' is not a program"]),
    (["--", "README.md"], ["launch: command: 'README.md' is not a program", "executable"]),
    (["--print-tf-config"], ["launch: --hosts: '' names no host"]),
    (["--print-tf-config", "--hosts", "a", "--port", "0"], ["launch: --port: 0 is out of range"]),
    (["--print-tf-config", "--hosts", "a", "--port", "65534"], ["launch: --port: 65534 is out of range"]),
    (["--print-tf-config", "--hosts", "a", "--port", "http"], ["launch: --port: 'http' is not a whole number"]),
    (["--print-tf-config", "--hosts", "a", "--workers", "0"], ["launch: --workers: 0 is too few"]),
    (["--print-tf-config", "--hosts", "a", "--", COLD_PYTHON], ["launch: command: acts on a running cluster"]),
    (["--print-tf-config", "--hosts", "a", "--timeout", "5"], ["launch: --timeout: acts on a running cluster"]),
    (["--print-tf-config", "--hosts", "a", "--tolerate_worker_loss"], ["--tolerate_worker_loss: acts on"]),
], ids=lambda value: " ".join(value) if isinstance(value, list) and value and value[0].startswith("-") else None)
def test_bad_launcher_options_are_one_line_with_status_2(argv, words, capsys):
    from tfsyncmodes import launch

    with pytest.raises(SystemExit) as exited:
        launch.parse_args(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfsyncmodes: error: launch: "), captured.err
    for word in words:
        assert word in lines[0]


def test_launcher_options_that_are_fine():
    from tfsyncmodes import launch

    args = launch.parse_args(["--workers", "3", "--ps", "0", "--timeout", "2.5", "--tolerate_worker_loss",
                              "--", PYTHON, "-c", "pass"])
    assert (args.workers, args.ps, args.timeout, args.command) == (3, 0, 2.5, [PYTHON, "-c", "pass"])
    assert launch.parse_args(["--", PYTHON]).timeout == 0.0  # no limit
    args = launch.parse_args(["--print-tf-config", "--hosts", "a,b", "--port", "4000"])
    assert (args.hosts, args.port) == (["a", "b"], 4000)


@pytest.mark.timeout(120)
def test_launcher_command_that_cannot_start_stops_before_any_task():
    # Run as a file: the launcher alone, without importing TensorFlow.
    result = localrun.run([PYTHON, os.path.join(REPO, "tfsyncmodes", "launch.py"), "--workers", "1", "--ps", "0",
                           "--", "no_such_program_here", "--flag"], timeout=100, env=clean_env(), cwd=REPO)
    assert "'no_such_program_here' is not a program" in one_clear_error(result)
    assert "[launch] started" not in result.stdout


# --- every knob (flag, TFSYNC_* variable, config key: one parser each) ---------------------

NUMBER = ["abc", "-1e30", "1e30", "nan", "inf", "true"]
INTEGER = NUMBER + ["2.5"]
# Bad values of every knob, by knob (test_every_knob_has_bad_values fails when a knob has none).
BAD_KNOB_VALUES = {
    "mode": ["bogus", ""], "backend": ["nccl", "bogus"], "mode_schedule": ["bogus", "sync:150%"],
    "collective_timeout": NUMBER + ["0.5"], "slow_worker": ["x", "bogus", "1:0.5", "-1:2", "1:4@60%-30%"],
    "ps_shards": INTEGER + ["0"], "min_shard_bytes": INTEGER + ["0"],
    "clip_norm": NUMBER + ["0", "-1", "on"], "staleness_aware_lr": ["maybe", "2"], "exactly_once": ["maybe", "2"], "steps_ahead": INTEGER + ["-1", "auto"], "topk_shared_indices": ["maybe", "2"], "compression_per_tensor": ["maybe", "2"],
    "lr_decay": NUMBER + ["0", "auto"], "max_staleness": INTEGER + ["-1", "-2", "auto"],
    "delay_compensation": NUMBER + ["0"],
    "group_size": INTEGER + ["0", "-1", "auto"], "groups": ["0,1;1", "a", "0;;1", "bogus"],
    "compression": ["bogus", "gzip"], "topk_ratio": NUMBER + ["0"], "error_feedback": ["maybe", "2"],
    "staleness": INTEGER + ["-1", "1001"], "period": INTEGER + ["0"], "cross_group": ["bogus"],
    "fragments": INTEGER + ["0", "-1", "1025"],
    "outer_optimizer": ["bogus"], "outer_lr": NUMBER + ["0", "off"], "outer_momentum": NUMBER + ["1"],
    "warmup_steps": INTEGER + ["-1"], "elastic_alpha": NUMBER + ["0", "1.5", "off"],
    "local_steps": ["0", "3", "bogus"], "switch_policy": ["bogus"], "switch_threshold": NUMBER + ["1"],
    "switch_interval": INTEGER + ["1"], "switch_patience": INTEGER + ["0"],
    "quantize_sigma": NUMBER + ["0", "off"], "dgc": ["maybe", "2"], "dgc_masking": ["maybe", "2"],
    "dgc_momentum": NUMBER + ["1"],
    "dgc_clip_norm": NUMBER + ["0", "auto"], "dgc_warmup_steps": INTEGER + ["-1"],
    "elastic": ["maybe", "2"], "elastic_commit": INTEGER + ["0", "-1", "step"],
    "elastic_join_timeout": NUMBER + ["0.5"],
    "elastic_lr": ["bogus", "linear"],
}


# The bad values every parser of its kind must refuse (a knob's own list may add more). A
# parser of another kind fails test_every_knob_has_bad_values until it has a row here.
BAD_BY_PARSER = {
    Number: lambda parse: NUMBER + (["2.5"] if parse.type is int else []),
    Boolean: lambda parse: ["maybe", "2"],
    Choice: lambda parse: ["bogus"],
    Text: lambda parse: ["bogus"],
}


def generic_bad_values(knob):
    parse = knob.parse
    for kind, values in BAD_BY_PARSER.items():
        if isinstance(parse, kind):
            return values(parse)
    raise AssertionError(f"knob {knob.key}: no bad values known for its parser {parse!r}: add them to BAD_BY_PARSER")


def test_every_knob_has_bad_values():
    """Every knob of KNOBS has a list here, and it holds what its parser's kind must refuse."""
    missing = sorted(set(knobs.KNOBS_BY_KEY) - set(BAD_KNOB_VALUES))
    assert not missing, f"give these knobs bad values in BAD_KNOB_VALUES: {missing}"
    assert not set(BAD_KNOB_VALUES) - set(knobs.KNOBS_BY_KEY), "BAD_KNOB_VALUES names a knob that is gone"
    for knob in knobs.KNOBS:
        absent = [v for v in generic_bad_values(knob) if v not in BAD_KNOB_VALUES[knob.key]]
        assert not absent, f"knob {knob.key}: BAD_KNOB_VALUES lacks {absent}"


def refused(source, value, call):
    try:
        call()
    except ConfigError as error:
        message = str(error)
        assert message.startswith(source), (source, message)
        assert error.fix, message  # every refusal says what to give instead
        return message
    pytest.fail(f"{source}{value!r} was accepted")


def test_every_knob_refuses_bad_values_from_every_source(tmp_path):
    """Each bad value of each knob, in this one process (the parsers are pure Python): as its
    TFSYNC_* variable, its --sync_ flag, its config-file key and a code argument, one
    ConfigError naming that source and field, with a fix."""
    path = tmp_path / "bad.yaml"
    for knob in knobs.KNOBS:
        values = BAD_KNOB_VALUES[knob.key]
        assert values, knob.key
        for value in values:
            refused(f"argument: {knob.key}: ", value,
                    lambda: config.resolve(overrides={knob.key: value}, environ={}, use_flags=False))
            if value == "":  # an empty variable, flag or key means the default
                continue
            refused(f"environment: {knob.env}: ", value,
                    lambda: config.resolve(environ={knob.env: value}, use_flags=False))
            refused(f"flag: --{knob.flag}: ", value, lambda: flag_defs.parse_known(["prog", f"--{knob.flag}={value}"]))
            path.write_text(f"{knob.key}: {value}\n")
            refused(f"config file {path}: {knob.key}: ", value,
                    lambda: config.resolve(environ={"TFSYNC_CONFIG": str(path)}, use_flags=False))


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), -1.0])
def test_numeric_flags_refuse_nan_and_infinity(value):
    with pytest.raises(ConfigError) as raised:
        at_least(value, 0.0, "flag", "--compute_ms")
    assert str(raised.value).startswith("flag: --compute_ms: ")
