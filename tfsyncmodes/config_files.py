"""The shipped config files, ``configs/<mode>.yaml``, and the knob reference page,
``docs/configuration/knobs.md``, generated from the knob table.

Each lists every knob its mode uses with the shipped default, what it does, what it accepts and
its flag and environment variable. A knob that has no effect with the mode's defaults (e.g.
``topk_ratio`` while ``compression`` is ``none``) is listed commented out, with what it depends
on, so that loading the file as shipped warns about nothing. ``tests/test_config.py`` checks
that ``configs/`` matches :func:`render`, and ``tests/test_docs.py`` that the page matches
:func:`render_reference`; after changing a knob, regenerate both with::

    python -m tfsyncmodes.config_files configs docs/configuration/knobs.md
"""
from __future__ import annotations

import os
import sys
import textwrap

import yaml

from tfsyncmodes.knobs import KNOBS, in_force

MODES = {
    "sync": ("sync mode: every step's gradients are averaged over all replicas before the update.",
             "python scripts/train.py --sync_config=configs/sync.yaml"),
    "async": ("async mode: workers read and update variables on parameter servers at their own pace "
              "(tf.distribute ParameterServerStrategy); the chief coordinates.",
              "python -m tfsyncmodes.launch --workers 2 --ps 1 -- "
              "python scripts/train.py --sync_config=configs/async.yaml"),
    "hybrid": ("hybrid mode: horovodrun ranks form groups that average gradients densely every "
               "step; across groups, the groups' models are averaged every period steps (or "
               "exchanged in the background, at most staleness steps late).",
               "horovodrun -np 4 python scripts/train.py --sync_config=configs/hybrid.yaml (on one host add "
               "--sync_group_size=2: one group per host makes one group there)"),
}
WIDTH = 96


def _comment(text: str) -> list:
    return textwrap.wrap(text, WIDTH - 2, initial_indent="# ", subsequent_indent="# ")


def render(mode: str) -> str:
    """The text of ``configs/<mode>.yaml``."""
    what, command = MODES[mode]
    values = {knob.key: knob.default_for(mode) for knob in KNOBS}
    values["mode"] = mode
    lines = _comment(f"tfsyncmodes configuration for {what}") + ["#"] + _comment(f"Use with: {command}") + _comment(
        "Precedence (lowest first): built-in defaults < this file < TFSYNC_<KEY> environment variables "
        "< --sync_<key> flags < arguments in code. Keys are knob names (or their flag names). Generated "
        "from tfsyncmodes/knobs.py by python -m tfsyncmodes.config_files.")
    for knob in KNOBS:
        if not knob.used_by(mode):
            continue
        acting = in_force(knob, values)
        syntax = knob.parse.syntax + "." if knob.parse.syntax else ""
        applies = "" if acting else f" Applies with {knob.applies.depends}."
        lines += [""] + _comment(f"{knob.help} Accepts {syntax}{applies} Flag --{knob.flag}, env {knob.env}.")
        entry = yaml.safe_dump({knob.key: values[knob.key]}, default_flow_style=False).strip()
        lines.append(entry if acting else "# " + entry)
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _value(value) -> str:
    return "`" + (yaml.safe_dump(value, default_flow_style=True).strip().removesuffix("...").strip()
                  if not isinstance(value, str) else repr(value) if value == "" else value) + "`"


def render_reference() -> str:
    """The text of ``docs/configuration/knobs.md``: every knob with its flag, environment
    variable, what it accepts, its default (and each mode's, where it differs), when it
    applies and its help."""
    lines = ["# Knob reference", "",
             "<!-- Generated from tfsyncmodes/knobs.py by "
             "python -m tfsyncmodes.config_files configs docs/configuration/knobs.md; do not edit. -->", "",
             "Every knob is a flag `--sync_<key>`, an environment variable `TFSYNC_<KEY>` and a key of a "
             "YAML file given with `--sync_config` (precedence, lowest first: built-in defaults < the "
             "file < the environment < flags < arguments in code). A knob given explicitly that does "
             "not apply in the resolved configuration is one warning line.", "",
             "| key | flag | env | accepts | default | applies |", "|---|---|---|---|---|---|"]
    for knob in KNOBS:
        default = _value(knob.default) + "".join(f"; {mode}: {_value(value)}" for mode, value in knob.mode_defaults)
        lines.append(f"| [`{knob.key}`](#{knob.key}) | `--{knob.flag}` | `{knob.env}` | "
                     f"{_cell(knob.parse.syntax or 'text')} | {_cell(default)} | {_cell(knob.applies.depends if knob.applies.modes or knob.applies.text else 'always')} |")
    for knob in KNOBS:
        lines += ["", f"## `{knob.key}`", "", _cell(knob.help), "",
                  f"- flag `--{knob.flag}`, environment variable `{knob.env}`",
                  f"- accepts {knob.parse.syntax or 'text'}",
                  f"- default {_value(knob.default)}"
                  + "".join(f"; in {mode} mode {_value(value)}" for mode, value in knob.mode_defaults),
                  "- applies " + (f"with {knob.applies.depends}" if knob.applies.modes or knob.applies.text
                                  else "in every mode")]
    return "\n".join(lines) + "\n"


def main(argv) -> None:
    directory = argv[1] if len(argv) > 1 else "configs"
    for mode in MODES:
        with open(os.path.join(directory, f"{mode}.yaml"), "w", encoding="utf-8") as handle:
            handle.write(render(mode))
    if len(argv) > 2:
        with open(argv[2], "w", encoding="utf-8") as handle:
            handle.write(render_reference())


if __name__ == "__main__":
    main(sys.argv)
