"""NumPy references for the steps the distributed tests run."""
import numpy as np

FEATURES, OUTPUTS, BATCH, LR = 5, 3, 4, 0.1


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
