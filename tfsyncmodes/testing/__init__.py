"""Fault injection and the harness that tests and benchmarks share.

Not needed to train. What is here:

- :mod:`~tfsyncmodes.testing.faults`: ``--sync_slow_worker=INDEX:FACTOR``, a straggler users may
  rehearse with (a Keras callback for Horovod ranks, a throttled process for async workers);
- :mod:`~tfsyncmodes.testing.throttle`: slows a whole process down (SIGSTOP/SIGCONT);
- :mod:`~tfsyncmodes.testing.localrun`: local ``horovodrun`` jobs on loopback only, bounded in
  time, nothing left behind;
- :mod:`~tfsyncmodes.testing.netns`: several "hosts" on one machine (network namespaces on a
  private bridge), and :mod:`~tfsyncmodes.testing.ssh`: an ``sshd`` per host for
  ``horovodrun -H``.
"""
