"""``once.loops_in``: the loops of a traced unit of writes, where a lost worker's step can be cut
on the server (TensorFlow checks for the abort at each loop iteration; a started op runs to its
end). Real traced functions: a loop at the top, a loop inside a conditional's branch (a function
of the graph's library), and a unit of writes with conditionals and no loop."""
import tensorflow as tf  # noqa: E402  (a broken TensorFlow must fail these tests, not skip them)

from tfsyncmodes.keras.once import loops_in


def traced(fn, *args):
    return tf.function(fn).get_concrete_function(*args)


def test_a_loop_in_the_unit_is_found():
    def unit(x):
        return tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, v * 2.0), (0, x))[1]

    loops = loops_in(traced(unit, tf.constant(1.0)))
    assert len(loops) == 1 and "while" in loops[0], loops


def test_a_loop_inside_a_conditionals_branch_is_found():
    def unit(x):
        def looping():
            return tf.while_loop(lambda v: v < 10.0, lambda v: v + 1.0, [x])[0]

        return tf.cond(x > 0.0, looping, lambda: x)

    graph_def = traced(unit, tf.constant(1.0)).graph.as_graph_def()
    assert not any(n.op in ("While", "StatelessWhile") for n in graph_def.node)  # in a branch only
    assert len(loops_in(traced(unit, tf.constant(1.0)))) == 1


def test_writes_with_conditionals_and_no_loop_have_none():
    variable = tf.Variable(tf.zeros([4]))
    ring = tf.Variable(tf.zeros([8], tf.int64))

    def unit(update, step_id):
        applied = variable.assign_sub(0.1 * update)
        scaled = tf.cond(step_id > 2, lambda: update * 2.0, lambda: update)
        with tf.control_dependencies([applied, variable.assign_add(scaled)]):
            return ring.scatter_update(tf.IndexedSlices(tf.reshape(step_id + 1, [1]),
                                                        tf.reshape(step_id % 8, [1]))).read_value()

    assert loops_in(traced(unit, tf.ones([4]), tf.constant(3, tf.int64))) == []
