"""Solutions of lesson 09's exercises (put into the notebook's exercise cells by the tests)."""

SOLUTIONS = {
    "half_weight_after": r'''
def half_weight_after(w0, delta, steps, master):
    """The fp16 weight after `steps` updates of +delta from w0 (see above); a np.float16."""
    dtype = np.float32 if master else np.float16
    w, step = dtype(w0), dtype(delta)
    for _ in range(steps):
        w = dtype(w + step)          # every sum rounded to the dtype that holds the weight
    return np.float16(w)             # the model computes with the fp16 rounding
''',
    "scaler_update": r'''
def scaler_update(scale, clean_steps, overflows_left, found_inf, *, growth_factor=2.0,
                  backoff_factor=0.5, growth_interval=2000, hysteresis=2, min_scale=1.0):
    """One step of the dynamic loss scale: returns (scale, clean_steps, overflows_left)."""
    if found_inf:
        if overflows_left <= 1:      # the hysteresis-th overflow in a row, or later
            scale = max(scale * backoff_factor, min_scale)
        else:
            overflows_left -= 1
        return scale, 0, overflows_left
    clean_steps += 1
    if clean_steps >= growth_interval:
        scale, clean_steps = scale * growth_factor, 0
    return scale, clean_steps, hysteresis
''',
}
