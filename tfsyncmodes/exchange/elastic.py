"""Elastic averaging across hybrid groups (``--sync_cross_group=elastic``): EASGD, after Zhang,
Choromanska and LeCun, *Deep learning with Elastic Averaging SGD* (NeurIPS 2015,
arXiv 1412.6651).

Each group trains on its own group mean. Every tau = `period` updates (every update during
the first `warmup_steps`), after the inner update:

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
so it explores less for the same alpha (a smaller alpha gives more exploration).

Without an alpha (``--sync_elastic_alpha=0``, the default) the paper's recommendation alpha = beta / p
with beta = 0.9 (p: the number of groups) is taken, so the center moves 0.9 of the way to the
groups' mean each round; alpha must keep beta = G * alpha <= 1 (the paper's stability range for
the center, 0 <= beta <= 1). The paper's momentum variant (EAMSGD) is local Nesterov momentum inside each
worker: here the inner optimizer's, e.g. ``keras.optimizers.SGD(momentum=0.99, nesterov=True)``
(the paper's delta = 0.99). The center is optimizer state (created with the ``state``
factory): the initial broadcast, checkpoints and ``model.save`` carry it. Training ends with
every rank holding the center.
"""
from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tfsyncmodes.exchange import communicators
from tfsyncmodes.exchange.flat import assign_flat, flatten_variables
from tfsyncmodes.exchange.link import CrossGroupLink
from tfsyncmodes.exchange.policies import RoundPolicy
from tfsyncmodes.registry import CROSS_GROUP

PAPER_BETA = 0.9  # the paper's recommended moving rate of the center: alpha = beta / groups


def alpha_for(num_groups: int, alpha: Optional[float] = None) -> float:
    """The elastic coefficient for `num_groups` groups: `alpha`, or the paper's beta / groups
    when None. ValueError when groups * alpha is above 1 (the center would overshoot)."""
    alpha = alpha if alpha is not None else PAPER_BETA / num_groups
    if not alpha > 0 or num_groups * alpha > 1.0 + 1e-12:
        raise ValueError(f"elastic alpha {alpha} for {num_groups} groups: use a value in "
                         f"(0, {1.0 / num_groups:.6g}] (groups * alpha at most 1)")
    return alpha


@CROSS_GROUP.register("elastic")
class ElasticAverage(RoundPolicy):
    """EASGD across groups: every `period`-th update the groups' compressed differences to the
    center move the center by `alpha` times their sum, then each group moves beta = G * alpha of
    the way toward the new center (see the module's docstring for the variant). The final
    model is the center. `alpha` None: the paper's 0.9 / G; G * alpha must be at most 1."""

    reference_name, step_name = "elastic_center", "elastic_step"

    def __init__(self, link: CrossGroupLink, period: int = 8, warmup_steps: int = 0,
                 alpha: Optional[float] = None):
        super().__init__(link, period, warmup_steps)
        self.alpha = alpha_for(link.num_groups, alpha)
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
        if not self.active:
            return
        center = communicators.world_average(self.center, "tfsync.elastic.finish")
        self.center.assign(center)
        assign_flat(variables, center)
