"""``lost_writing`` for async_checks.py: the worker of one step dies while the parameter server
is in the middle of that step's unit of writes.

Wraps ``AppliedSteps.on_ps`` and ``AppliedSteps.mark``. For the step to lose, the unit takes
longer on the server: once the model's writes (the update, the metrics) are made, about
FIRST_WAIT seconds of work, whose end the writes return with their logs, then about
SECOND_WAIT, and only then the step's mark. The worker of that step aborts HOLD seconds after
every value the unit needs is on the server (the unit starts only then), so it dies during the
first stretch: the update is written, the mark not yet. A unit the worker's loss can stop there
leaves the step applied and unmarked, and the coordinator's re-run applies it again.

The unit's stretches are chains of matrix products (:func:`hold`), not loops: when the worker
dies, the server aborts what is left of its step there, and TensorFlow stops a loop at its next
iteration, so a busy-wait loop in the unit is a point where the worker's loss cuts it (with
loops, the counted shape below had its step applied twice in 5 of 5 runs). The worker writes
the time it aborts to a file and the lost unit records when its last stretch ended: the window
was held open if the second is well after the first.
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


def hold(seconds, after, slowed):
    """The time at the end of about `seconds` of work where the op is placed (matrix products,
    no loop), once every op in `after` has run, when `slowed` is 1; at once when it is 0."""
    import tensorflow as tf

    eye = tf.eye(1024)

    def busy():
        with tf.control_dependencies(after):  # from a clock's reading: nothing to fold at trace
            x = eye * tf.cast(tf.timestamp() > 0.0, tf.float32)
        for _ in range(int(seconds * 40)):  # about 40 products a second here
            x = tf.linalg.matmul(x, x)
        with tf.control_dependencies([x]):  # x[0, 0] is 1: used, so the products are made
            return tf.timestamp() + tf.cast(x[0, 0], tf.float64) - 1.0

    def at_once():
        with tf.control_dependencies(after):
            return tf.timestamp()

    return tf.cond(tf.greater(slowed, 0.0), busy, at_once)


def abort_while_writing(step_id_to_lose, fired, claims, note, ended, counted=None):
    """`note`: the file the worker writes the time it aborts to; `ended`: a float64 variable on
    the server, the time the lost unit's last stretch ended. `counted`: an int64 variable [4] on
    the server; the unit of the step to lose adds 1 to entry 0 after its update, 1 and 2 after
    each stretch, 3 after its mark (each bump ordered after the op before it), and its mark
    follows an Identity of the last stretch's end made after the last bump: what each unit of
    that step got through."""
    import tensorflow as tf

    from tests.workers.async_checks import abort_once, record_traced_step_ids, tracing_step_id
    from tfsyncmodes.keras import once

    on_ps, mark = once.AppliedSteps.on_ps, once.AppliedSteps.mark
    waits = {}  # the end of the second stretch of the step traced, for its mark to follow

    def writing(self, writes, *values):
        flat = [tf.cast(tf.reduce_sum(v), tf.float64) for v in tf.nest.flatten(values) if v is not None]
        with tf.device(self.ring.device):
            on_server = tf.add_n(flat)  # needs every value of the unit on the server
        # On the worker, HOLD seconds after the server holds them: it aborts.
        abort_once(step_id_to_lose, fired, claims, "lost while its step was written",
                   after=[wait(HOLD, [on_server])], note=note)
        # The unit starts once the sum has been made (and sent), not before.
        with tf.device(self.ring.device), tf.control_dependencies([on_server]):
            values = tf.nest.map_structure(lambda t: None if t is None else tf.identity(t), values)

        def slow_writes(*held):
            outputs = writes(*held)
            slowed = tf.cast(tf.equal(tracing_step_id(), step_id_to_lose), tf.float64)
            after = [tf.identity(t) for t in tf.nest.flatten(outputs)]
            if counted is not None:
                after = [bump(0, slowed, after)]
            first = hold(FIRST_WAIT, after, slowed)
            second = hold(SECOND_WAIT, [first if counted is None else bump(1, slowed, [first])], slowed)
            noted = ended.assign(tf.maximum(ended, second * slowed)).op  # the re-run's would be later
            with tf.control_dependencies([noted if counted is None else bump(2, slowed, [second, noted])]):
                waits["second"] = tf.identity(second)
            return {**outputs, "test_first_wait": first}

        outputs = dict(on_ps(self, slow_writes, *values))
        first = outputs.pop("test_first_wait")
        tf.debugging.Assert(tf.greater(first, 0.0), [first])  # the worker takes it
        return outputs

    def marking(self, step_id, written):
        with tf.control_dependencies([waits.pop("second")]):
            step_id = tf.identity(step_id)
        marked = mark(self, step_id, written)
        if counted is None:
            return marked
        lost = tf.cast(tf.equal(step_id, step_id_to_lose), tf.float64)
        with tf.control_dependencies([bump(3, lost, [marked])]):
            return tf.no_op()

    def bump(entry, slowed, after):
        """Adds 1 to `counted[entry]` for the step to lose (0 for the others), after `after`."""
        with tf.control_dependencies(after):
            return counted.scatter_add(tf.IndexedSlices(
                tf.reshape(tf.cast(slowed, tf.int64), [1]), tf.constant([entry]))).read_value()

    record_traced_step_ids()
    once.AppliedSteps.on_ps = writing
    once.AppliedSteps.mark = marking
