"""Running a ``--sync_mode_schedule`` that passes through async: one process layout per phase.

Async mode runs on a ``ParameterServerStrategy`` cluster (chief, workers, ps) and sync and
hybrid under ``horovodrun``, so a schedule such as ``sync:1e,async:1e,sync`` cannot switch in
one process. ``python -m tfsyncmodes.launch`` runs its phases one after another instead
(:mod:`tfsyncmodes.switching.phases.launching`); each phase's training script restores a mode-neutral
checkpoint written by the previous phase (:mod:`tfsyncmodes.switching.phases.checkpoint`), trains its
epochs and writes the next one; one History and one TensorBoard log span the whole run
(:mod:`tfsyncmodes.switching.phases.run`). The plan (which phase trains which epochs) is
:mod:`tfsyncmodes.switching.phases.plan`.

Sync-Switch (Li et al., "Sync-Switch: Hybrid Parameter Synchronization for Distributed Deep
Learning", ICDCS 2021, arXiv:2104.08364) switches one TensorFlow job between bulk-synchronous
and asynchronous parameter synchronisation; its offline policy trains the start of a run with
BSP and the rest with ASP, for close to BSP's accuracy at close to ASP's throughput.
"""
