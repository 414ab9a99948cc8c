"""NumPy references for the steps the distributed tests run."""
import math

import numpy as np

FEATURES, OUTPUTS, BATCH, LR = 5, 3, 4, 0.1


def speed_shares(step_times, period):
    """Each group's inner steps a round by the rule local_steps.py documents, written here on
    its own: try as the round's length the fastest group's `period` steps and each group's share
    period * t_fastest / t_g rounded up times its step; under each, every group runs the whole
    steps that fit (1 to `period`); keep the first of most steps per second of its longest group."""
    fastest = min(step_times)
    lengths = [period * fastest] + [math.ceil(period * fastest / t - 1e-9) * t for t in step_times]
    best, shares = -1.0, None
    for length in lengths:
        steps = [min(period, max(1, math.floor(length / t + 1e-6))) for t in step_times]
        rate = sum(steps) / max(n * t for n, t in zip(steps, step_times))
        if rate > best * (1 + 1e-9):
            best, shares = rate, steps
    return shares


def linear_data(steps: int, replicas: int, seed: int = 7):
    """x: [steps, replicas, BATCH, FEATURES], y: [steps, replicas, BATCH, OUTPUTS]."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((steps, replicas, BATCH, FEATURES)).astype("float32")
    y = rng.standard_normal((steps, replicas, BATCH, OUTPUTS)).astype("float32")
    return x, y


def mse_gradients(kernel, bias, x, y):
    """Gradients of Keras' mean squared error (mean over outputs, then over the batch)."""
    d_pred = 2.0 * (x @ kernel + bias - y) / (x.shape[0] * y.shape[1])
    return x.T @ d_pred, d_pred.sum(axis=0)


def mean_gradient_training(kernel, bias, x, y, optimizer="sgd", lr=LR,
                           beta_1=0.9, beta_2=0.999, epsilon=1e-7):
    """Each step: every replica's gradient on its own batch, averaged, then one update."""
    params = [np.asarray(kernel, np.float64), np.asarray(bias, np.float64)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    for step in range(x.shape[0]):
        per_replica = [mse_gradients(*params, x[step, r], y[step, r]) for r in range(x.shape[1])]
        grads = [np.mean([g[i] for g in per_replica], axis=0) for i in range(2)]
        t = step + 1
        for i, g in enumerate(grads):
            if optimizer == "sgd":
                params[i] = params[i] - lr * g
            else:
                m[i] = beta_1 * m[i] + (1 - beta_1) * g
                v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
                lr_t = lr * np.sqrt(1 - beta_2 ** t) / (1 - beta_1 ** t)
                params[i] = params[i] - lr_t * m[i] / (np.sqrt(v[i]) + epsilon)
    return params


def mean_gradient_training_losses(kernel, bias, x, y, optimizer="sgd"):
    """losses[step, replica]: Keras' mean squared error of each replica's batch at the weights
    the step starts from (what each rank's ``loss`` metric accumulates), under the training of
    :func:`mean_gradient_training`."""
    losses = np.zeros(x.shape[:2])
    for step in range(x.shape[0]):
        params = mean_gradient_training(kernel, bias, x[:step], y[:step], optimizer)
        for replica in range(x.shape[1]):
            pred = x[step, replica].astype(np.float64) @ params[0] + params[1]
            losses[step, replica] = np.mean((pred - y[step, replica]) ** 2)
    return losses


# --- hybrid mode ---------------------------------------------------------------------------

def topk_compress(flat, ratio):
    """(values, int32 indices) of the ceil(ratio * n) entries of largest magnitude."""
    k = max(1, min(flat.size, int(np.ceil(ratio * flat.size - 1e-9))))
    indices = np.argsort(-np.abs(flat), kind="stable")[:k].astype(np.int32)
    return flat[indices], indices


def topk_decompress(values, indices, size):
    dense = np.zeros(size, np.float32)
    np.add.at(dense, indices, values)
    return dense


def _flat(params):
    return np.concatenate([p.reshape(-1) for p in params]).astype(np.float32)


def _unflat(flat, like):
    out, start = [], 0
    for p in like:
        out.append(flat[start:start + p.size].reshape(p.shape).astype(np.float32))
        start += p.size
    return out


def resolved_outer_momentum(outer_momentum, period):
    """The documented auto: DiLoCo's 0.9 for rounds of 500 inner steps or more, 0.3 below."""
    if outer_momentum != "auto":
        return outer_momentum
    assert period is not None, "auto outer momentum needs the period"
    return 0.9 if period >= 500 else 0.3


def outer_step(anchor, velocity, mean_change, outer_optimizer, outer_lr, outer_momentum):
    """The outer optimizer on the groups' mean change: (next anchor, next velocity)."""
    if outer_optimizer == "nesterov":
        lr_out, pseudo = np.float32(0.7 if outer_lr == "auto" else outer_lr), -mean_change
        velocity = (np.float32(outer_momentum) * velocity + pseudo).astype(np.float32)
        return (anchor - lr_out * (pseudo + np.float32(outer_momentum) * velocity)).astype(np.float32), velocity
    return (anchor + np.float32(1.0 if outer_lr == "auto" else outer_lr) * mean_change).astype(np.float32), velocity


def _cross_group_send(updates, residuals, compression, ratio, error_feedback, roundtrip=None):
    """Each group's update through error feedback and the compressor. Returns, per group, what
    it sent (decompressed) and the sum of what the other groups sent. Updates `residuals`.
    `roundtrip(update) -> dense`: what another (sparse, allgathered) compression sends."""
    size = updates[0].size
    wire, sent = [], []
    for g, update in enumerate(updates):
        compensated = (update + residuals[g]).astype(np.float32) if error_feedback else update
        if roundtrip is not None:
            dense = roundtrip(compensated)
            wire.append(dense)
        elif compression == "topk":
            dense = topk_decompress(*topk_compress(compensated, ratio), size)
            wire.append(dense)
        elif compression == "fp16":
            wire.append(compensated.astype(np.float16))
            dense = wire[-1].astype(np.float32)
        else:
            dense = compensated
            wire.append(dense)
        sent.append(dense)
        if error_feedback and compression != "none":
            residuals[g] = (compensated - dense).astype(np.float32)
    if compression == "topk" or roundtrip is not None:
        others = [np.sum([w for h, w in enumerate(wire) if h != g], axis=0, dtype=np.float32)
                  for g in range(len(updates))]
    else:  # an allreduce in the payload's dtype, minus this group's part
        total = wire[0]
        for part in wire[1:]:
            total = (total.astype(np.float32) + part.astype(np.float32)).astype(wire[0].dtype)
        others = [(total.astype(np.float32) - w.astype(np.float32)).astype(np.float32) for w in wire]
    return sent, others


def hybrid_training(kernel, bias, x, y, groups, compression="none", topk_ratio=0.01,
                    error_feedback=True, staleness=0, cross_group="stale", warmup_steps=0, lr=LR,
                    consensus=True, schedule=None, staleness_aware_lr=True, outer_optimizer="average",
                    outer_lr="auto", outer_momentum="auto", elastic_alpha="auto", period=1, roundtrip=None):
    """SGD in hybrid mode, step by step in float32; returns each group's [kernel, bias],
    with `consensus`, at the end every group holds the mean over all ranks (the final model average).

    stale: group g applies (its dense mean gradient + the other groups' part of the rounds
    it takes in at step t) / groups, where round t sends each group's dense mean gradient
    through error feedback and the compressor. `schedule[g][t]` is how many rounds after the
    warm-up group g has applied once step t is done (the run records it: rounds come in when
    the slowest group has sent them); without one, every round applies at its own step. With
    `staleness_aware_lr` a round applied l steps after its own step counts 1 / (1 + l).
    periodic: each group applies its own mean gradient; after every `period`-th update
    the groups' model changes since the last average go through error feedback and the
    compressor, and every group moves to anchor + their mean.
    The first `warmup_steps` steps have staleness 0 (stale: round t applies at step t;
    periodic: an average every step). periodic's `outer_optimizer`: average moves the anchor by
    outer_lr (default 1) x the mean change; nesterov (outer_lr default 0.7) is PyTorch's SGD with
    Nesterov momentum on the pseudo-gradient -(mean change).
    elastic: each group applies its own mean gradient; on periodic's schedule the groups'
    differences to the center go through error feedback and the compressor, the center moves
    by alpha x their sum, then each group moves groups x alpha of the way to the new center
    (alpha auto: 0.9 / groups); at the end every group holds the center. (`staleness` acts
    through `schedule`, under stale only.) `roundtrip`: a quantizing compression's replay (see
    :func:`_cross_group_send`).
    """
    start = [np.asarray(kernel, np.float32), np.asarray(bias, np.float32)]
    size = _flat(start).size
    params = [[p.copy() for p in start] for _ in groups]
    residuals = [np.zeros(size, np.float32) for _ in groups]
    rounds = []
    anchor = _flat(start)
    velocity = np.zeros(size, np.float32)
    lr = np.float32(lr)
    for step in range(x.shape[0]):
        means = []
        for g, ranks in enumerate(groups):
            grads = [_flat(mse_gradients(*[p.astype(np.float64) for p in params[g]], x[step, r], y[step, r]))
                     for r in ranks]
            means.append(np.mean(grads, axis=0, dtype=np.float64).astype(np.float32))
        if cross_group in ("periodic", "elastic"):
            updates = means
        else:
            rounds.append(_cross_group_send(means, residuals, compression, topk_ratio,
                                            error_feedback, roundtrip)[1])
            late = []
            for g in range(len(groups)):
                if step < warmup_steps or schedule is None:
                    late.append(rounds[step][g])
                    continue
                done = step - warmup_steps
                taken = range(schedule[g][done - 1] if done else 0, schedule[g][done])
                total = np.zeros(size, np.float32)
                for j in taken:
                    weight = np.float32(1.0) / (np.float32(1.0) + np.float32(done - j)) \
                        if staleness_aware_lr else np.float32(1.0)
                    total = (total + weight * rounds[warmup_steps + j][g]).astype(np.float32)
                late.append(total)
            updates = [((means[g] + late[g]) / np.float32(len(groups))).astype(np.float32)
                       for g in range(len(groups))]
        params = [_unflat(_flat(params[g]) - lr * updates[g], start) for g in range(len(groups))]
        if cross_group == "periodic" and ((step + 1) % period == 0 or step < warmup_steps):
            deltas = [_flat(p) - anchor for p in params]
            sent, others = _cross_group_send(deltas, residuals, compression, topk_ratio, error_feedback, roundtrip)
            mean_change = ((sent[0] + others[0]) / np.float32(len(groups))).astype(np.float32)
            anchor, velocity = outer_step(anchor, velocity, mean_change, outer_optimizer, outer_lr,
                                          resolved_outer_momentum(outer_momentum, period))
            params = [_unflat(anchor, start) for _ in groups]
        if cross_group == "elastic" and ((step + 1) % period == 0 or step < warmup_steps):
            params, anchor = elastic_round(params, anchor, residuals, compression, topk_ratio,
                                           error_feedback, elastic_alpha, start, roundtrip)
    if cross_group == "elastic" and consensus and len(groups) > 1:
        return [_unflat(anchor, start) for _ in groups]
    if not consensus or len(groups) == 1:
        return params
    ranks = [_flat(params[g]) for g, group in enumerate(groups) for _ in group]
    consensus = _unflat(np.sum(ranks, axis=0, dtype=np.float32) / np.float32(len(ranks)), start)
    return [consensus for _ in groups]


def elastic_round(params, center, residuals, compression, ratio, error_feedback, alpha, like, roundtrip=None):
    """One EASGD round across groups (``--sync_cross_group=elastic``): returns the groups' models
    and the center after it. The center moves by alpha x the sum of the groups' compressed
    differences to it (as the policy adds them: its own payload + the others'), then each
    group moves beta = groups x alpha of the way to the new center."""
    groups = len(params)
    alpha = 0.9 / groups if alpha == "auto" else alpha
    keep = np.float32(1.0 - groups * alpha)  # what is left of a group's distance to the center
    deltas = [_flat(p) - center for p in params]
    sent, others = _cross_group_send(deltas, residuals, compression, ratio, error_feedback, roundtrip)
    center = (center + np.float32(alpha) * (sent[0] + others[0]).astype(np.float32)).astype(np.float32)
    return [_unflat(center + keep * (_flat(p) - center), like) for p in params], center


def compressed_mean_training(kernel, bias, x, y, compression, ratio=0.01, error_feedback=True, lr=LR):
    """SGD in sync mode with compression, in float32: each replica compresses its gradient plus
    its residual, every replica applies the mean of the decompressed payloads, and keeps what
    its payload left out (with `error_feedback`; without, the residual stays zero).
    ``topk_union`` (Top-K with ``--sync_topk_shared_indices``): each replica sends its own
    values at the union of every replica's Top-K indices.

    fp16, as the exchange documents it (communicators.CrossGroupAllreduce): each rank's
    compensated float32 gradient is cast to float16, the float16 payloads are summed by one
    allreduce in float16, the sum is cast to float32 and divided by the number of ranks in
    float32. Here the float16 sum is NumPy's float16 addition (each addition rounded to
    float16), in rank order: for two ranks that is the one correctly rounded sum, whatever the
    order; for more, Horovod's ring may add in another order and round differently."""
    params = [np.asarray(kernel, np.float32), np.asarray(bias, np.float32)]
    replicas = x.shape[1]
    residuals = [np.zeros(_flat(params).size, np.float32) for _ in range(replicas)]
    for step in range(x.shape[0]):
        sent, compensateds = [], []
        for r in range(replicas):
            grad = _flat(mse_gradients(*[p.astype(np.float64) for p in params], x[step, r], y[step, r]))
            compensated = (grad.astype(np.float32) + residuals[r]) if error_feedback else grad.astype(np.float32)
            compensateds.append(compensated)
        # topk_union: every replica sends its values at the union of all replicas' Top-K indices.
        union = (np.unique(np.concatenate([topk_compress(c, ratio)[1] for c in compensateds]))
                 if compression == "topk_union" else None)
        for r, compensated in enumerate(compensateds):
            if compression == "topk":
                dense = topk_decompress(*topk_compress(compensated, ratio), compensated.size)
            elif compression == "topk_union":
                dense = topk_decompress(compensated[union], union, compensated.size)
            else:
                dense = compensated.astype(np.float16)
            sent.append(dense)
            if error_feedback:
                residuals[r] = (compensated - dense.astype(np.float32)).astype(np.float32)
        total = sent[0]
        for part in sent[1:]:
            total = total + part  # float16 + float16 stays float16, as on the wire
        mean = total.astype(np.float32) / np.float32(replicas)
        params = _unflat(_flat(params) - np.float32(lr) * mean, params)
    return params


def local_steps_training(kernel, bias, x, y, groups, round_steps, compression="none", topk_ratio=0.01,
                         error_feedback=True, outer_optimizer="average", outer_lr="auto", outer_momentum="auto",
                         period=None,
                         lr=LR, consensus=True, weighted=True):
    """Periodic averaging with speed-proportional local steps (``--sync_local_steps=auto``), replaying
    the schedule a run recorded: in round r group g runs `round_steps[r][g]` SGD steps on its own
    next batches (its k-th step on x[k] of its ranks), then sends w_g x (model - anchor), w_g =
    steps_g / sum of the round's steps, through error feedback and the compressor; the weighted
    sum is the mean change the outer optimizer applies to the anchor, and every group starts the
    next round from it (without `weighted`, w_g = 1 / groups). Returns each group's [kernel, bias] (with `consensus`, the final mean)."""
    start = [np.asarray(kernel, np.float32), np.asarray(bias, np.float32)]
    size = _flat(start).size
    params = [[p.copy() for p in start] for _ in groups]
    residuals = [np.zeros(size, np.float32) for _ in groups]
    anchor, velocity, lr = _flat(start), np.zeros(size, np.float32), np.float32(lr)
    position = [0 for _ in groups]
    for steps in round_steps:
        for g, ranks in enumerate(groups):
            for _ in range(int(steps[g])):
                t = position[g]
                grads = [_flat(mse_gradients(*[p.astype(np.float64) for p in params[g]], x[t, r], y[t, r]))
                         for r in ranks]
                mean = np.mean(grads, axis=0, dtype=np.float64).astype(np.float32)
                params[g] = _unflat(_flat(params[g]) - lr * mean, start)
                position[g] += 1
        total = np.float32(np.sum(steps))
        weights = [np.float32(steps[g]) / total if weighted else np.float32(1.0 / len(groups))
                   for g in range(len(groups))]
        weighted_changes = [(weights[g] * (_flat(params[g]) - anchor)).astype(np.float32) for g in range(len(groups))]
        sent, others = _cross_group_send(weighted_changes, residuals, compression, topk_ratio, error_feedback)
        mean_change = (sent[0] + others[0]).astype(np.float32)
        anchor, velocity = outer_step(anchor, velocity, mean_change, outer_optimizer, outer_lr,
                                      resolved_outer_momentum(outer_momentum, period))
        params = [_unflat(anchor, start) for _ in groups]
    if not consensus or len(groups) == 1:
        return params, position
    ranks = [_flat(params[g]) for g, group in enumerate(groups) for _ in group]
    mean = _unflat(np.sum(ranks, axis=0, dtype=np.float32) / np.float32(len(ranks)), start)
    return [mean for _ in groups], position
