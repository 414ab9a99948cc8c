"""The harness that tests and benchmarks share.

Not needed to train. What is here:

- :mod:`~tfsyncmodes.testing.localrun`: local ``horovodrun`` jobs on loopback only, bounded in
  time, nothing left behind;
- :mod:`~tfsyncmodes.testing.netns`: several "hosts" on one machine (network namespaces on a
  private bridge), and :mod:`~tfsyncmodes.testing.ssh`: an ``sshd`` per host for
  ``horovodrun -H``.

``--slow_worker`` fault injection is a feature of the package: :mod:`tfsyncmodes.faults`.
"""
