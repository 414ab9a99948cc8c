"""``lost_writing`` for async_checks.py: the worker of one step dies while the parameter server
is in the middle of that step's unit of writes.

Wraps ``AppliedSteps.on_ps`` and ``AppliedSteps.mark``. For the step to lose, the unit takes
longer on the server: once the model's writes (the update, the metrics) are made, a wait of
FIRST_WAIT seconds, whose end the writes return with their logs, then a wait of SECOND_WAIT,
and only then the step's mark. The worker of that step aborts HOLD seconds after every value
the unit needs is on the server (the unit starts only then), so it dies during the first
wait: the update is written, the mark not yet. A unit the worker's loss can stop there leaves
the step applied and unmarked, and the coordinator's re-run applies it again.
"""
FIRST_WAIT, SECOND_WAIT, HOLD = 2.0, 0.3, 0.5


def wait(seconds, after):
    """The time `seconds` after the op starts, which is once every op in `after` has run (a
    busy loop on tf.timestamp, where the op is placed)."""
    import tensorflow as tf

    with tf.control_dependencies(after):
        start = tf.timestamp()
    return tf.while_loop(lambda now: now < start + seconds, lambda now: [tf.timestamp()],
                         [start], parallel_iterations=1)


def abort_while_writing(step_id_to_lose, fired, claims):
    import tensorflow as tf

    from tests.workers.async_checks import abort_once, record_traced_step_ids, tracing_step_id
    from tfsyncmodes.keras import once

    on_ps, mark = once.AppliedSteps.on_ps, once.AppliedSteps.mark
    waits = {}  # the second wait of the step traced, for its mark to follow

    def writing(self, writes, *values):
        flat = [tf.cast(tf.reduce_sum(v), tf.float64) for v in tf.nest.flatten(values) if v is not None]
        with tf.device(self.ring.device):
            on_server = tf.add_n(flat)  # needs every value of the unit on the server
        # On the worker, HOLD seconds after the server holds them: it aborts.
        abort_once(step_id_to_lose, fired, claims, "lost while its step was written",
                   after=[wait(HOLD, [on_server])])
        # The unit starts once the sum has been made (and sent), not before.
        with tf.device(self.ring.device), tf.control_dependencies([on_server]):
            values = tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), values)

        def slow_writes(*held):
            outputs = writes(*held)
            slowed = tf.cast(tf.equal(tracing_step_id(), step_id_to_lose), tf.float64)
            first = wait(FIRST_WAIT * slowed, [tf.identity(t) for t in tf.nest.flatten(outputs)])
            waits["second"] = wait(SECOND_WAIT * slowed, [first])
            return {**outputs, "test_first_wait": first}

        outputs = dict(on_ps(self, slow_writes, *values))
        first = outputs.pop("test_first_wait")
        tf.debugging.Assert(tf.greater(first, 0.0), [first])  # the worker takes it
        return outputs

    def marking(self, step_id, written):
        with tf.control_dependencies([waits.pop("second")]):
            step_id = tf.identity(step_id)
        return mark(self, step_id, written)

    record_traced_step_ids()
    once.AppliedSteps.on_ps = writing
    once.AppliedSteps.mark = marking
