"""NumPy reference for Adam through a ``--sync_mode_schedule`` of sync and periodic-hybrid phases,
written from the documented rules (docs/ARCHITECTURE.md, *Switching modes within a run*):

- sync: one Adam step on the mean gradient of all replicas, the same on every rank;
- hybrid (``cross_group=periodic``, the ``average`` outer step, no compression): each group
  takes an Adam step on its own ranks' mean gradient with its own moments; after every
  `period`-th step of the phase every group moves to the groups' mean model;
- leaving hybrid: every rank takes the groups' mean model, and the inner optimizer's float
  state (Adam's moments) is averaged over all ranks; the step count goes on.
"""
import numpy as np

from tests.reference import LR, mse_gradients


def adam_through_phases(kernel, bias, x, y, phases, groups, period, lr=LR, beta_1=0.9, beta_2=0.999,
                        epsilon=1e-7):
    """x: [steps, replicas, BATCH, FEATURES]; phases: (mode, start, end) with end exclusive.
    Returns end[t][rank]: each rank's flat weights (kernel then bias) at the end of step t."""
    replicas = x.shape[1]
    of_rank = [next(g for g, ranks in enumerate(groups) if r in ranks) for r in range(replicas)]
    params = [[np.asarray(kernel, np.float64), np.asarray(bias, np.float64)] for _ in groups]
    m = [[np.zeros_like(p) for p in params[0]] for _ in groups]
    v = [[np.zeros_like(p) for p in params[0]] for _ in groups]
    end = np.zeros((x.shape[0], replicas, kernel.size + bias.size))

    def adam(g, grads, t):
        lr_t = lr * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
        for i, grad in enumerate(grads):
            m[g][i] = beta_1 * m[g][i] + (1 - beta_1) * grad
            v[g][i] = beta_2 * v[g][i] + (1 - beta_2) * grad * grad
            params[g][i] = params[g][i] - lr_t * m[g][i] / (np.sqrt(v[g][i]) + epsilon)

    def mean_gradient(g, ranks, t):
        per_rank = [mse_gradients(*params[g], x[t, r], y[t, r]) for r in ranks]
        return [np.mean([p[i] for p in per_rank], axis=0) for i in range(2)]

    def everyone_takes_the_mean(states):
        mean = [np.mean([s[i] for s in states], axis=0) for i in range(2)]
        for s in states:
            s[:] = [a.copy() for a in mean]

    for mode, start, stop in phases:
        for t in range(start, stop):
            if mode == "sync":
                grads = mean_gradient(0, range(replicas), t)
                for g in range(len(groups)):
                    adam(g, grads, t + 1)
            else:
                for g, ranks in enumerate(groups):
                    adam(g, mean_gradient(g, ranks, t), t + 1)
                if (t - start + 1) % period == 0:
                    everyone_takes_the_mean(params)
            for r in range(replicas):
                end[t, r] = np.concatenate([p.reshape(-1) for p in params[of_rank[r]]])
        if mode == "hybrid":
            everyone_takes_the_mean(params)
            everyone_takes_the_mean(m)
            everyone_takes_the_mean(v)
    return end
