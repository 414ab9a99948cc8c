"""Switching modes within one run: everything about it lives in this subpackage.

- :mod:`~tfsyncmodes.switching.plans`, :mod:`~tfsyncmodes.switching.policy`: *switch plans*
  (registered in :data:`tfsyncmodes.registry.SWITCH_PLANS`): whether a run's configuration
  switches, between which modes, and which callbacks decide when (``--sync_mode_schedule``,
  ``--sync_switch_policy=straggler``). A plan in force makes the strategy
  (:class:`~tfsyncmodes.switching.strategy.SwitchingStrategy`).
- :mod:`~tfsyncmodes.switching.callback`: :class:`ModeSwitch`, the public switch at a step
  boundary, and the ``--sync_mode_schedule`` driver.
- :mod:`~tfsyncmodes.switching.decision` (pure) and
  :mod:`~tfsyncmodes.switching.straggler`: the online straggler policy.
- :mod:`~tfsyncmodes.switching.auto` (the profile and the pick, pure),
  :mod:`~tfsyncmodes.switching.auto_policy` (``--sync_switch_policy=auto``: the callback that
  profiles and switches) and :mod:`~tfsyncmodes.switching.auto_mode`: ``--sync_mode=auto``.
- :mod:`~tfsyncmodes.switching.phases`: schedules through async, one process layout per phase.

Below this package, the optimizer wrapper knows only that its exchange can be swapped at a
step boundary (:class:`~tfsyncmodes.exchange.switchable.SwitchableExchange`, built by
:func:`tfsyncmodes.exchange.recipes.exchange_for` when a plan is in force); the grammar of
``--sync_mode_schedule`` is a knob's (:mod:`tfsyncmodes.schedule`).

References: Sync-Switch (Li et al., ICDCS 2021, arXiv 2104.08364) switches a TensorFlow job
between synchronisation protocols within a run, by offline schedules and online policies;
PyTorch's post-local SGD (``PostLocalSGDState(start_localSGD_iter=...)``) is the fixed
schedule "global allreduce for a warm-up, then periodic averaging in subgroups".
"""
