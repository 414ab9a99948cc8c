"""Online switching between sync and hybrid within one ``horovodrun`` job.

- :mod:`~tfsyncmodes.switching.decision`: the straggler policy's decision (pure, no TensorFlow).
- :mod:`~tfsyncmodes.switching.candidates`: the process sets every possible grouping needs,
  registered at ``hvd.init``.
- :mod:`~tfsyncmodes.switching.straggler`: the Keras callback that measures, exchanges and
  switches (``--switch_policy=straggler``).
- :mod:`~tfsyncmodes.switching.auto`: ``--sync_mode=auto``'s rule (pure) and probe.
"""
