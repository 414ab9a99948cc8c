"""Elastic averaging across hybrid groups (``--sync_cross_group=elastic``): EASGD, after Zhang,
Choromanska and LeCun, *Deep learning with Elastic Averaging SGD* (NeurIPS 2015,
arXiv 1412.6651).

Each group trains on its own group mean. Every tau = ``--sync_period`` updates (every update
during the first ``--sync_warmup_steps``), after the inner update:

1. every group sends its elastic difference ``d_g = x_g - center`` through the cross-group
   link (error feedback, then the configured compressor, like periodic's pseudo-gradient);
   the sum over the groups of what arrives moves the center, which every rank holds a copy
   of::

       center <- center + alpha * sum_g C(d_g)          (the paper's eq. 6: the center moves
                                                          beta = G * alpha of the way to the
                                                          groups' mean)

2. every group then moves the same fraction beta = G * alpha of the way toward the **new**
   center::

       x_g <- center + (1 - beta) * (x_g - center)

The paper's synchronous EASGD (eqs. 5-6) moves each worker alpha, not beta, of the way, and
toward the *old* center (both sides at once, so the elastic force is symmetric and
``sum_g x_g + center`` is conserved). Here the fraction is symmetric instead and the center
moves first. That is the variant in which "alpha such that groups fully average each round" is
periodic averaging: with alpha = 1/G (beta = 1) the center becomes ``center + mean_g C(d_g)``,
exactly periodic's ``anchor + mean change`` with the same compressor and error feedback, and
every group lands on it, as periodic's do on the anchor. For small alpha the two agree to
first order on how far the center moves; a group is pulled G times harder than in the paper,
so it explores less for the same alpha (a smaller ``--sync_elastic_alpha`` gives more exploration).

``--sync_elastic_alpha=auto`` (the default) takes the paper's recommendation alpha = beta / p with
beta = 0.9 (p: the number of groups), so the center moves 0.9 of the way to the groups' mean
each round; alpha must keep beta = G * alpha <= 1 (the paper's stability range for the center,
0 <= beta <= 1). The paper's momentum variant (EAMSGD) is local Nesterov momentum inside each
worker: here the inner optimizer's, e.g. ``keras.optimizers.SGD(momentum=0.99, nesterov=True)``
(the paper's delta = 0.99). The center is optimizer state (created with the ``state``
factory): the initial broadcast, checkpoints and ``model.save`` carry it. Training ends with
every rank holding the center.
"""
from __future__ import annotations

import tensorflow as tf

from tfsyncmodes.errors import ConfigError
from tfsyncmodes.exchange.flat import assign_flat, flatten_variables
from tfsyncmodes.exchange.policies import RoundPolicy
from tfsyncmodes.registry import CROSS_GROUP

PAPER_BETA = 0.9  # the paper's recommended moving rate of the center: alpha = beta / groups


def elastic_alpha(config, num_groups: int) -> float:
    """The elastic coefficient for `num_groups` groups: ``--sync_elastic_alpha``, or beta / groups
    with the paper's beta = 0.9 when it is 0. A ConfigError when groups * alpha > 1."""
    alpha = PAPER_BETA / num_groups if config.elastic_alpha == "auto" else config.elastic_alpha
    if num_groups * alpha > 1.0 + 1e-12:
        from tfsyncmodes.exchange.groups import _field

        source, field = _field(config, "elastic_alpha")
        raise ConfigError(source, field, f"{alpha} times {num_groups} groups is above 1 (the center would "
                                         "overshoot the groups' mean)",
                          f"use a value in (0, {1.0 / num_groups:.6g}], or auto for {PAPER_BETA}/{num_groups}")
    return alpha


@CROSS_GROUP.register("elastic")
class ElasticAverage(RoundPolicy):
    """EASGD across groups: every `period`-th update the groups' compressed differences to the
    center move the center by alpha times their sum, then each group moves beta = G * alpha of
    the way toward the new center (see the module's docstring for the variant). The final
    model is the center."""

    reference_name, step_name = "elastic_center", "elastic_step"

    def __init__(self, config, link):
        super().__init__(config, link)
        self.alpha = elastic_alpha(config, link.num_groups)
        self.beta = link.num_groups * self.alpha

    @property
    def center(self):
        """The center copy of the model (the model itself before the first update)."""
        return self.reference

    def round(self, variables):
        model, center = flatten_variables(variables), tf.convert_to_tensor(self.center)
        payload = self.link.send(model - center)
        total = self.link.sent(payload) + self.link.exchange(payload)
        center = center + self.alpha * total
        self.center.assign(center)
        assign_flat(variables, center + (1.0 - self.beta) * (model - center))

    def finish(self, variables) -> None:
        """Every rank takes the center. It is the same on every rank up to the order of the
        sums of more than two groups' payloads, so one dense allreduce (mean over all ranks)
        makes it bit-equal everywhere; it is also the final barrier (see the base class)."""
        if not self.link.active:
            return
        import horovod.tensorflow as hvd

        center = hvd.allreduce(tf.convert_to_tensor(self.center), op=hvd.Average,
                               process_set=hvd.global_process_set, name="tfsync.elastic.finish")
        self.center.assign(center)
        assign_flat(variables, center)
