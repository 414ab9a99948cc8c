"""absl flags for every knob in :data:`tfsyncmodes.config.KNOBS`, plus ``--config``.

Importing this module defines them; :func:`tfsyncmodes.config.resolve` reads only the ones
given on the command line, so a flag's default never hides a config file or an environment
variable.
"""
from absl import flags

from tfsyncmodes.config import KNOBS

if "config" not in flags.FLAGS:
    flags.DEFINE_string("config", None, "YAML file with tfsyncmodes knobs (see configs/).")

for _knob in KNOBS:
    if _knob.flag in flags.FLAGS:
        continue
    # Declared as strings so that resolve() validates every source with the same parser and
    # the same message.
    flags.DEFINE_string(_knob.flag, str(_knob.default), f"{_knob.help} [env {_knob.env}]")
