"""NumPy replay of streaming periodic averaging (``--sync_fragments``), written from the schedule
the docs give, not from the implementation: fragment p of K is entries [p*n//K, (p+1)*n//K) of the
flattened model, averaged after the updates s (from 1) where (s - p*H//K) is a multiple of H; a
warm-up update averages the whole model."""
import numpy as np

from tests.reference import (LR, _cross_group_send, _flat, _unflat, mse_gradients, outer_step,
                             resolved_outer_momentum)


def fragment_bounds(size, fragments):
    """[(start, stop)] of each fragment of `size` entries."""
    return [(p * size // fragments, (p + 1) * size // fragments) for p in range(fragments)]


def due_fragment(step, period, fragments):
    """The fragment averaged after update `step` (from 1), or None."""
    due = [p for p in range(fragments) if (step - p * period // fragments) % period == 0]
    assert len(due) <= 1, (step, period, fragments)
    return due[0] if due else None


def streaming_training(kernel, bias, x, y, groups, period, fragments, compression="none", topk_ratio=0.01,
                       error_feedback=True, warmup_steps=0, outer_optimizer="average", outer_lr="auto",
                       outer_momentum="auto", lr=LR):
    """SGD in float32, each group on its own group mean gradient; after update s the due
    fragment's entries (all entries during the warm-up) go round: each group's change of them
    since their last average, plus its residual of them, through the compressor; the outer
    optimizer moves their anchor (with its momentum of those entries) by the groups' mean, and
    every group takes the new anchor for those entries only. At the end every rank holds the
    mean over all ranks. Returns ([kernel, bias] each group ends with, the rounds as (step,
    fragment or 'whole'))."""
    start = [np.asarray(kernel, np.float32), np.asarray(bias, np.float32)]
    size = _flat(start).size
    flats = [_flat(start) for _ in groups]
    residuals = [np.zeros(size, np.float32) for _ in groups]
    anchor, velocity = _flat(start), np.zeros(size, np.float32)
    momentum = resolved_outer_momentum(outer_momentum, period)
    bounds, lr, rounds = fragment_bounds(size, fragments), np.float32(lr), []
    for step in range(1, x.shape[0] + 1):
        for g, ranks in enumerate(groups):
            params = [p.astype(np.float64) for p in _unflat(flats[g], start)]
            grads = [_flat(mse_gradients(*params, x[step - 1, r], y[step - 1, r])) for r in ranks]
            flats[g] = (flats[g] - lr * np.mean(grads, axis=0, dtype=np.float64).astype(np.float32)).astype(np.float32)
        fragment = "whole" if step <= warmup_steps else due_fragment(step, period, fragments)
        if fragment is None:
            continue
        lo, hi = (0, size) if fragment == "whole" else bounds[fragment]
        kept = [r[lo:hi].copy() for r in residuals]
        sent, others = _cross_group_send([f[lo:hi] - anchor[lo:hi] for f in flats], kept, compression, topk_ratio,
                                         error_feedback)
        for g in range(len(groups)):
            residuals[g][lo:hi] = kept[g]
        mean_change = ((sent[0] + others[0]) / np.float32(len(groups))).astype(np.float32)
        anchor[lo:hi], velocity[lo:hi] = outer_step(anchor[lo:hi], velocity[lo:hi], mean_change, outer_optimizer,
                                                    outer_lr, momentum)
        for f in flats:
            f[lo:hi] = anchor[lo:hi]
        rounds.append((step, fragment))
    ranks = [flats[g] for g, group in enumerate(groups) for _ in group]
    mean = np.sum(ranks, axis=0, dtype=np.float32) / np.float32(len(ranks))
    return [_unflat(mean, start) for _ in groups], [_unflat(f, start) for f in flats], rounds
