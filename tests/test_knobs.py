"""The knob table: explicit words instead of numeric sentinels, one meaning per knob, when a
knob is in force (the warning for one that is not, describe()), and the flags' help."""
import logging
import subprocess

import pytest

from tests.conftest import PYTHON, REPO, clean_env
from tfsyncmodes import config, flags as flag_defs, knobs
from tfsyncmodes.errors import ConfigError


def resolve(**values):
    return config.resolve(values, environ={}, use_flags=False)


@pytest.mark.parametrize("key, given, parsed", [
    ("group_size", "host", "host"), ("group_size", "4", 4), ("group_size", 4, 4),
    ("clip_norm", "off", "off"), ("clip_norm", False, "off"), ("clip_norm", "2.5", 2.5),
    ("lr_decay", "OFF", "off"), ("lr_decay", 0.1, 0.1),
    ("delay_compensation", "off", "off"), ("delay_compensation", "0.04", 0.04),
    ("max_staleness", "off", "off"), ("max_staleness", "0", 0), ("max_staleness", 3, 3),
    ("outer_lr", "auto", "auto"), ("outer_lr", "0.7", 0.7),
    ("elastic_alpha", "auto", "auto"), ("elastic_alpha", 0.25, 0.25),
    ("local_steps", "fixed", "fixed"), ("local_steps", "auto", "auto"),
    ("period", "8", 8), ("period", 8.0, 8), ("staleness", "0", 0),
])
def test_explicit_words_and_numbers(key, given, parsed):
    """The parsed value is the word (a str) or the number; YAML's bare off (False) is off."""
    value = getattr(resolve(mode="hybrid", **{key: given}), key)
    assert value == parsed and type(value) is type(parsed)


@pytest.mark.parametrize("key, old, fix", [
    ("group_size", "0", "use host or an integer in [1, 1048576]"),
    ("clip_norm", "0", "use off or a number in (0, 1e+09]"),
    ("clip_norm", 0.0, "use off or a number in (0, 1e+09]"),
    ("lr_decay", "0", "use off or a number in (0, 1000]"),
    ("delay_compensation", "0.0", "use off or a number in (0, 1000]"),
    ("max_staleness", "-1", "use off or an integer in [0, 1073741824]"),
    ("outer_lr", "0", "use auto or a number in (0, 10]"),
    ("elastic_alpha", "0", "use auto or a number in (0, 1]"),
    ("local_steps", "0", "use fixed; the inner steps between averages are the knob period"),
    ("local_steps", "3", "use fixed with period=3"),
])
def test_old_sentinels_are_refused_naming_the_word(key, old, fix):
    knob = knobs.KNOBS_BY_KEY[key]
    with pytest.raises(ConfigError) as raised:
        config.resolve(environ={knob.env: str(old)}, use_flags=False)
    assert str(raised.value).startswith(f"environment: {knob.env}: {str(old)!r} is not accepted any more (it meant ")
    assert str(raised.value).endswith(fix)
    with pytest.raises(ConfigError, match=f"^argument: {key}: .* is not accepted any more"):
        resolve(**{key: old})


def test_consumers_see_words_and_period(tmp_path):
    """What the exchange reads: period for periodic and elastic, staleness for stale only."""
    from tfsyncmodes.exchange import knob_settings

    defaults = resolve(mode="hybrid")
    assert (defaults.staleness, defaults.period, defaults.local_steps, defaults.group_size) == (7, 8, "auto", "host")
    assert knob_settings.period(defaults) == 8
    assert knob_settings.elastic_alpha(defaults, 3) == pytest.approx(0.3)
    assert knob_settings.elastic_alpha(resolve(mode="hybrid", cross_group="elastic", elastic_alpha=0.2), 3) == 0.2
    asynchronous = resolve(mode="async")
    assert (asynchronous.clip_norm, asynchronous.lr_decay, asynchronous.max_staleness,
            asynchronous.delay_compensation) == ("off",) * 4


def test_optimizers_saved_before_the_words_load(tmp_path):
    """Knobs a model saved before period and the words existed mean what they meant then."""
    old = {"mode": "hybrid", "staleness": 2, "local_steps": 0, "clip_norm": 0.0, "max_staleness": -1,
           "group_size": 0, "outer_lr": 0.0, "elastic_alpha": 0.0, "momentum": 0.9}
    loaded = config.from_saved(old)
    assert (loaded.period, loaded.local_steps, loaded.staleness) == (3, "fixed", 2)
    assert (loaded.clip_norm, loaded.max_staleness, loaded.group_size, loaded.outer_lr) == ("off", "off", "host", "auto")
    assert config.from_saved(dict(old, local_steps=5)).period == 5
    assert config.from_saved(dict(old, local_steps="auto")).local_steps == "auto"
    assert config.from_saved(config.knob_values(resolve(mode="hybrid", period=4))).period == 4


@pytest.mark.parametrize("values, in_force, not_in_force", [
    ({"mode": "sync"}, {"backend", "compression", "switch_policy"}, {"topk_ratio", "error_feedback", "staleness",
                                                                      "period", "clip_norm", "group_size",
                                                                      "topk_shared_indices"}),
    ({"mode": "sync", "compression": "topk"}, {"topk_ratio", "error_feedback", "topk_shared_indices"}, {"staleness"}),
    ({"mode": "hybrid", "compression": "topk"}, {"topk_ratio"}, {"topk_shared_indices"}),
    ({"mode": "hybrid"}, {"period", "local_steps", "outer_lr", "outer_optimizer", "group_size", "warmup_steps"},
     {"staleness", "staleness_aware_lr", "outer_momentum", "elastic_alpha", "backend", "switch_policy"}),
    ({"mode": "hybrid", "cross_group": "stale"}, {"staleness", "staleness_aware_lr"},
     {"period", "local_steps", "outer_lr", "elastic_alpha"}),
    ({"mode": "hybrid", "cross_group": "elastic"}, {"period", "elastic_alpha"}, {"staleness", "local_steps"}),
    ({"mode": "hybrid", "outer_optimizer": "nesterov"}, {"outer_momentum"}, set()),
    ({"mode": "hybrid", "groups": "0,1;2,3"}, {"groups"}, {"group_size"}),
    ({"mode": "async"}, {"clip_norm", "max_staleness", "staleness_aware_lr", "ps_shards", "exactly_once", "steps_ahead"},
     {"min_shard_bytes", "compression", "backend", "period"}),
    ({"mode": "async", "ps_shards": 2}, {"min_shard_bytes"}, set()),
    ({"mode": "sync", "switch_policy": "straggler"}, {"switch_threshold", "switch_interval", "group_size", "period"},
     {"staleness", "clip_norm"}),
    ({"mode": "auto"}, {"switch_threshold", "backend", "period", "group_size"}, {"switch_policy", "clip_norm"}),
    # A schedule: a knob is in force if it applies in any of its modes.
    ({"mode": "sync", "mode_schedule": "sync:50%,hybrid"}, {"backend", "period", "compression"}, {"clip_norm"}),
    ({"mode": "sync", "mode_schedule": "sync:1e,async"}, {"backend", "clip_norm"}, {"period"}),
])
def test_knobs_in_force(values, in_force, not_in_force):
    acting = set(resolve(**values).knobs_in_force())
    assert in_force <= acting and not (not_in_force & acting), (in_force - acting, not_in_force & acting)


def test_describe_lists_only_the_knobs_in_force():
    hybrid = resolve(mode="hybrid", cross_group="stale")
    lines = hybrid.describe().splitlines()
    assert lines[0] == "tfsyncmodes configuration (the knobs in force for mode hybrid):"
    listed = [line.split()[0] for line in lines[1:]]
    assert listed == list(hybrid.knobs_in_force())
    assert "staleness" in listed and "period" not in listed and "topk_ratio" not in listed
    every = hybrid.describe(every=True).splitlines()
    assert every[0] == "tfsyncmodes configuration (every knob):" and len(every) == 1 + len(knobs.KNOBS)


def test_a_knob_given_that_has_no_effect_is_one_warning_line(caplog, tmp_path, monkeypatch):
    monkeypatch.setattr(config, "_warned", set())  # lines other tests' resolves logged already
    caplog.set_level(logging.WARNING, logger="absl")
    resolve(mode="hybrid", topk_ratio=0.02)
    resolve(mode="hybrid", topk_ratio=0.02)  # the same run resolving again: no second line
    lines = [r.getMessage() for r in caplog.records if "has no effect" in r.getMessage()]
    assert lines == ["tfsyncmodes: topk_ratio (argument) has no effect: it applies with compression=topk or topk_int*, "
                     "and this run has mode=hybrid, compression=none"]
    caplog.clear()
    path = tmp_path / "c.yaml"
    path.write_text("mode: sync\nstaleness: 3\nclip_norm: 1.0\ncompression: topk\ntopk_ratio: 0.1\n")
    config.resolve(environ={"TFSYNC_CONFIG": str(path), "TFSYNC_PERIOD": "4"}, use_flags=False)
    lines = sorted(r.getMessage() for r in caplog.records if "has no effect" in r.getMessage())
    assert lines == sorted([
        f"tfsyncmodes: staleness (config file {path}) has no effect: it applies with cross_group=stale, "
        "and this run has mode=sync, cross_group=periodic",
        f"tfsyncmodes: clip_norm (config file {path}) has no effect: it applies with mode=async, "
        "and this run has mode=sync",
        "tfsyncmodes: TFSYNC_PERIOD (environment) has no effect: it applies with cross_group=periodic or "
        "elastic, and this run has mode=sync, cross_group=periodic"])


@pytest.mark.timeout(120)
def test_flag_not_in_force_warns_once_on_the_command_line():
    script = ("import tfsyncmodes\n"
              "def main(argv):\n"
              "    tfsyncmodes.resolve(); tfsyncmodes.resolve()\n"
              "tfsyncmodes.run(main)\n")
    result = subprocess.run([PYTHON, "-c", script, "--sync_topk_ratio=0.02"], capture_output=True, text=True,
                            timeout=100, cwd=REPO, env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if "has no effect" in line]
    assert len(lines) == 1, result.stderr[-3000:]
    assert lines[0].endswith("tfsyncmodes: --sync_topk_ratio (flag) has no effect: it applies with compression=topk or topk_int*, "
                             "and this run has mode=sync, compression=none"), lines


def test_help_names_each_modes_default_where_they_differ():
    knob = knobs.Knob("staleness", 2, knobs.Number(int, 0, 1000), "Lag bound.", knobs.given("cross_group", "stale"),
                      mode_defaults=(("hybrid", 7),))
    assert flag_defs.help_text(knob) == ("Lag bound. Default 2; hybrid: 7. Applies with cross_group=stale. "
                                         "[env TFSYNC_STALENESS; config key staleness]")
    assert (knob.default_for("hybrid"), knob.default_for("sync")) == (7, 2)


def test_every_knob_has_a_prefixed_flag_and_one_meaning():
    assert all(k.flag == "sync_" + k.key for k in knobs.KNOBS)
    assert "momentum" not in knobs.KNOBS_BY_KEY  # scripts/train.py's own --momentum
    for knob in knobs.KNOBS:  # the default parses to itself, and the help says when it applies
        assert knob.parse(knob.default) == knob.default, knob.key
        assert knob.applies.depends, knob.key
