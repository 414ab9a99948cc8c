"""What each compressor costs against a dense training step, on one rank.

    python -m benchmarks.compress_cost [--rounds=5] [--pairs=100] [--ranks=4] [--compressions=topk,int8,...]
        [--implementations=native,ops]

One process, no exchange: the digits MLP that ``benchmarks.bytes_target`` trains
(``--hidden_units`` 1024: 1,126,410 parameters) and one real gradient of it on a digits
batch, flattened as the exchange flattens the model. For every compression, built from its
knobs by the library's recipe (``--sync_compression``, ``--sync_topk_ratio`` 0.01) with each
of ``--implementations`` (``native``: the compiled kernels; ``ops``: TensorFlow ops, the same
bits), three calls are timed, each one ``tf.function``:

* ``compress + decompress``: one payload made and turned back into the dense update;
* ``... of RANKS payloads``: the payload made, then RANKS payloads concatenated part by part
  (what Horovod's allgather hands every rank) decompressed into their sum, as each rank does in
  a RANKS-rank exchange;
* the same with error feedback (the residual added before, and updated after).

Against them, dense training steps of the same model (``train_on_batch``, Adam, no exchange)
at two batch sizes: 16 (a rank's share of ``scripts/train.py``'s 64 at 4 ranks) and 64. The
calls are interleaved in ``--rounds`` rounds (median of 15 calls each); a cell is the median
over the rounds and their range. The target (#23): compress + decompress at most 0.10 of a
dense step. Per training step the cost is the per-call cost over the steps between two
exchanges (every step in sync mode; every ``--sync_period`` steps in hybrid's periodic
exchange). JSON ``docs/compress_cost.json`` and a section of ``docs/BENCHMARKS.md``.
"""
from __future__ import annotations

import json
import os
import statistics
import time

from absl import app, flags

from benchmarks.benchlib import DOCS, bad_flag, replace_section, rounds_cell, rounds_text

COMPRESSIONS = ("topk", "int8", "int4", "int2", "topk_int8", "topk_int4", "topk_int2")
BATCHES = (16, 64)
TARGET = 0.10

flags.DEFINE_list("compressions", list(COMPRESSIONS), "Compressions to time (--sync_compression values).")
flags.DEFINE_list("implementations", ["native", "ops"], "Each compression with each of these: native (the compiled "
                  "kernels) or ops (TensorFlow ops).")
flags.DEFINE_integer("rounds", 5, "Interleaved rounds (median of 15 calls of each call per round).")
flags.DEFINE_integer("pairs", 100, "Back-to-back pairs of training steps, with and without a compression, a round "
                     "(their median difference is what the compression adds inside a step).")
flags.DEFINE_integer("ranks", 4, "Payloads decompressed together, as at this many ranks.")
flags.DEFINE_integer("hidden_units", 1024, "The MLP's width (1024: 1,126,410 parameters).")
flags.DEFINE_float("topk_ratio", 0.01, "--sync_topk_ratio of the Top-K compressions.")
flags.DEFINE_string("docs_dir", DOCS, "Where the JSON and BENCHMARKS.md go.")
FLAGS = flags.FLAGS
PROGRAM = "benchmarks.compress_cost"


def check() -> None:
    """Bad flags: one line, status 2, before TensorFlow is imported (the names are this
    benchmark's own list, so that no part of the library is imported to check them)."""
    for name in FLAGS.compressions:
        if name not in COMPRESSIONS + ("fp16",):
            bad_flag(PROGRAM, "compressions", f"{name!r} is not a compression",
                     "use some of " + ", ".join(COMPRESSIONS + ("fp16",)))
    for name in FLAGS.implementations:
        if name not in ("native", "ops"):
            bad_flag(PROGRAM, "implementations", f"{name!r} is not an implementation", "use native, ops or both")
    for name in ("rounds", "pairs", "ranks", "hidden_units"):
        if FLAGS[name].value < 1:
            bad_flag(PROGRAM, name, f"{FLAGS[name].value} is too small", "use 1 or more")
    if not 0 < FLAGS.topk_ratio <= 1:
        bad_flag(PROGRAM, "topk_ratio", f"{FLAGS.topk_ratio} is not a fraction", "use a number in (0, 1]")


def rows() -> list:
    """(compression, implementation) of every row, in the table's order."""
    return [(name, implementation) for name in FLAGS.compressions for implementation in FLAGS.implementations]


def row_key(name: str, implementation: str) -> str:
    return name if implementation == "native" else f"{name}@{implementation}"


def plain(key: str, code: bool = False) -> str:
    """A row's name in the text: ``int8``, ``int8 (ops)`` (with `code`, the compression's name
    in backticks)."""
    base, _, other = key.partition("@")
    return (f"`{base}`" if code else base) + (f" ({other})" if other else "")


def training_step(model, loss, transform, ctx, per_tensor: bool = False):
    """One training step at batch 16 as one ``tf.function`` (forward, backward, Adam's update);
    with a `ctx`, the gradient flattened as the exchange flattens it, ``transform``-ed (compressed
    and decompressed) and unflattened before the update: what a compressor adds inside a step,
    with no call of its own. `per_tensor`: each variable's gradient ``transform``-ed on its own
    instead (``transform(vector, context=its context)``), as it comes, nothing flattened: what the
    compressor adds where the exchange does not flatten (sync's ``--sync_compression_per_tensor``).
    Adam is built first,
    outside the function."""
    import tensorflow as tf

    from tfsyncmodes.exchange.flat import TensorContext, flatten, unflatten
    from tfsyncmodes.keras.compat import keras

    variables = model.trainable_variables
    parts = [TensorContext.of_variables([v]) for v in variables]
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(variables)

    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        grads = tape.gradient(value, variables)
        if per_tensor:
            grads = [tf.reshape(transform(tf.reshape(g, [-1]), context=part), g.shape) for g, part in zip(grads, parts)]
        elif ctx is not None:
            grads = unflatten(transform(flatten(grads, variables)), variables)
        optimizer.apply_gradients(zip(grads, variables))
        return value

    return step


def calls() -> tuple:
    """({name: (function, args)}, the model's parameters): every timed call, warm (traced and
    run twice)."""
    import numpy as np
    import tensorflow as tf

    from tfsyncmodes import config
    from tfsyncmodes.exchange import knob_settings
    from tfsyncmodes.exchange.flat import TensorContext, flatten
    from tfsyncmodes.exchange.memory import default_memory
    from tfsyncmodes.keras.compat import keras
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((x.shape[1],)),
                              keras.layers.Dense(FLAGS.hidden_units, activation="relu"),
                              keras.layers.Dense(FLAGS.hidden_units, activation="relu"),
                              keras.layers.Dense(10)])
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=loss)
    with tf.GradientTape() as tape:
        value = loss(y[:64], model(x[:64], training=True))
    flat = flatten(tape.gradient(value, model.trainable_variables), model.trainable_variables)
    ctx = TensorContext.of_variables(model.trainable_variables)
    timed = {f"dense_step_{b}": (model.train_on_batch, (x[:b], y[:b])) for b in BATCHES}
    timed["step_16"] = (training_step(model, loss, lambda flat: flat, None), (x[:16], y[:16]))
    timed["flat.in_step"] = (training_step(model, loss, lambda flat: flat, ctx), (x[:16], y[:16]))
    for name, implementation in rows():
        knobs = config.resolve({"compression": name, "topk_ratio": FLAGS.topk_ratio}, environ={}, use_flags=False)
        compressor = knob_settings.compressor(knobs, implementation=implementation)
        if getattr(compressor, "implementation", None) is None and implementation != FLAGS.implementations[0]:
            continue  # a compression with one implementation (fp16) is timed once
        key = row_key(name, implementation)
        memory = default_memory(compressor)
        memory.build(ctx, lambda n, shape, dtype: tf.Variable(tf.zeros(shape, dtype), trainable=False))

        def gathered(payload):
            return tuple(tf.concat([part] * FLAGS.ranks, 0) for part in payload)

        def one(update, compressor=compressor, context=ctx):
            return compressor.decompress(compressor.compress(update, context), context)

        def all_ranks(update, compressor=compressor):
            return compressor.decompress(gathered(compressor.compress(update, ctx)), ctx)

        def with_memory(update, compressor=compressor, memory=memory):
            compensated = memory.compensate(update, ctx)
            payload = compressor.compress(compensated, ctx)
            remembered = memory.update(compensated, payload, compressor, ctx)
            with tf.control_dependencies([remembered]):
                return compressor.decompress(gathered(payload), ctx)

        for kind, function in (("one", one), ("ranks", all_ranks), ("feedback", with_memory)):
            timed[f"{key}.{kind}"] = (tf.function(function), (flat,))
        timed[f"{key}.in_step"] = (training_step(model, loss, one, ctx), (x[:16], y[:16]))
        timed[f"{key}.in_step_tensor"] = (training_step(model, loss, one, ctx, per_tensor=True), (x[:16], y[:16]))
    timed["empty_call"] = (tf.function(lambda v: v[:1]), (flat,))
    for function, args in timed.values():
        function(*args)
        function(*args)
    return timed, int(model.count_params())


def measure() -> dict:
    import numpy as np

    timed, parameters = calls()

    def once(function, args):
        started = time.perf_counter()
        out = function(*args)
        np.asarray(out[0] if isinstance(out, (tuple, list)) else out)
        return time.perf_counter() - started

    def paired(name):
        """The median over --pairs of (the step with `name`'s compression - the step without),
        each pair timed back to back (which goes first alternates), so that the machine's drift
        between them is small."""
        with_it, without = timed[name], timed["step_16"]
        differences = []
        for i in range(FLAGS.pairs):
            first, second = (with_it, without) if i % 2 == 0 else (without, with_it)
            a, b = once(*first), once(*second)
            differences.append(a - b if i % 2 == 0 else b - a)
        return statistics.median(differences)

    rounds = []
    for _ in range(FLAGS.rounds):
        cells = {name: statistics.median(once(*timed[name]) for _ in range(15))
                 for name in timed if ".in_step" not in name}
        cells.update({name.replace(".in_step", ".added"): paired(name) for name in timed if ".in_step" in name})
        rounds.append(cells)
    keys = [row_key(*row) for row in rows() if f"{row_key(*row)}.one" in timed]
    return {"parameters": parameters, "ranks": FLAGS.ranks, "topk_ratio": FLAGS.topk_ratio,
            "compressions": keys, "rounds": rounds}


def added(rounds, key: str, per_tensor: bool = False) -> tuple:
    """(median, low, high) over the rounds of what compression `key` adds to a training step
    (`per_tensor`: compressing each gradient on its own): the median of the paired differences
    over the step without it, within each round."""
    values = [r[f"{key}.added{'_tensor' if per_tensor else ''}"] / r["step_16"] for r in rounds]
    return statistics.median(values), min(values), max(values)


def verdict(keys, worst, what: str) -> str:
    met = [plain(k) for k in keys if worst(k) <= TARGET]
    missed = [plain(k) for k in keys if plain(k) not in met]
    return f"Within 0.10 in every round, {what}: {', '.join(met) or 'none'}; missed: {', '.join(missed) or 'none'}."


def write(results: dict) -> None:
    os.makedirs(FLAGS.docs_dir, exist_ok=True)
    with open(os.path.join(FLAGS.docs_dir, "compress_cost.json"), "w", encoding="utf-8") as handle:
        json.dump(results, handle, indent=1)
    rounds, ranks, keys = results["rounds"], results["ranks"], results["compressions"]
    lines = [f"## What each compressor costs: one rank, {results['parameters']:,} parameters", "",
             f"`python -m benchmarks.compress_cost --rounds={len(rounds)} --pairs={FLAGS.pairs}` — one process, no exchange: the digits "
             f"MLP of `benchmarks.bytes_target` and one real gradient of it, flattened as the exchange flattens "
             f"the model; each compression built by the library's recipe (Top-K ratio {results['topk_ratio']}), "
             f"one `tf.function` call each; *(ops)*: the same compression with TensorFlow ops instead of the "
             f"compiled kernels (the same bits; the kernels are what a compression runs when they are built). "
             "*Added inside a step*: a training step at batch 16 as one `tf.function` (forward, backward, Adam) "
             "with the gradient flattened, compressed, decompressed and unflattened, against the same step "
             f"without, timed in {FLAGS.pairs} back-to-back pairs a round (the median difference), as a share of that "
             "step: what the compressor and the exchange's flattening add to a step, with no call of their own "
             f"(flattening and unflattening alone: {rounds_text(added(rounds, 'flat'))}); *per tensor*: the "
             "same step with each variable's gradient compressed and decompressed on its own as it comes, "
             "nothing flattened (one scale or Top-K selection per tensor, as sync's exchange does with "
             "`--sync_compression_per_tensor`; by default it flattens). "
             f"*{ranks} ranks*: the payload made, then {ranks} payloads concatenated "
             f"as an allgather hands them over, decompressed into their sum (what each rank does in a {ranks}-rank "
             "exchange); *error feedback*: the same with the residual added and updated. Dense step: one "
             "`train_on_batch` (Adam, no exchange) at batch 16 (a rank's share of the trainer's 64 at 4 ranks) "
             f"and 64. Interleaved in {len(rounds)} rounds, median of 15 calls each; cells: median over the "
             "rounds [range]. Target: compress + decompress at most 0.10 of a dense step.", "",
             f"Dense step: batch 16 {rounds_text(rounds_cell(rounds, 'dense_step_16'))} ms, batch 64 "
             f"{rounds_text(rounds_cell(rounds, 'dense_step_64'))} ms; the batch-16 step as one `tf.function` "
             f"{rounds_text(rounds_cell(rounds, 'step_16'))} ms; an empty `tf.function` call "
             f"{rounds_text(rounds_cell(rounds, 'empty_call'))} ms (in every row of its own call).", "",
             f"| compression | added inside a step / that step | per tensor, added inside a step / that step | "
             f"compress + decompress (ms) | / dense step, batch 16 | "
             f"/ dense step, batch 64 | {ranks} ranks (ms) | {ranks} ranks / step 16 | with error feedback (ms) | "
             "error feedback / step 16 | per training step at period 4 / step 16 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def text(name, over=None):
        return rounds_text(rounds_cell(rounds, name, over))

    for name in keys:
        feedback = rounds_cell(rounds, f"{name}.feedback", "dense_step_16")
        lines.append(f"| {plain(name, code=True)} | **{rounds_text(added(rounds, name))}** | "
                     f"**{rounds_text(added(rounds, name, per_tensor=True))}** | {text(f'{name}.one')} | "
                     f"**{text(f'{name}.one', 'dense_step_16')}** | "
                     f"{text(f'{name}.one', 'dense_step_64')} | {text(f'{name}.ranks')} | "
                     f"{text(f'{name}.ranks', 'dense_step_16')} | {text(f'{name}.feedback')} | "
                     f"{rounds_text(feedback)} | {feedback[0] / 4:.3f} |")
    lines += ["", verdict(keys, lambda k: added(rounds, k)[2], "added inside a step"), "",
              verdict(keys, lambda k: added(rounds, k, per_tensor=True)[2], "per tensor, added inside a step"), "",
              verdict(keys, lambda k: rounds_cell(rounds, f"{k}.one", "dense_step_16")[2],
                      "as a call of its own over the batch-16 dense step")]
    replace_section(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), "compress_cost", "\n".join(lines) + "\n")


def main(argv):
    del argv
    check()
    results = measure()
    write(results)
    print(open(os.path.join(FLAGS.docs_dir, "BENCHMARKS.md"), encoding="utf-8").read().split(
        "<!-- bench:compress_cost:begin -->")[1].split("<!-- bench:compress_cost:end -->")[0])


if __name__ == "__main__":
    app.run(main)
