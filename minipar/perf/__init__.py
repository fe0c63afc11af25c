"""The performance model: predict a layout's step time, memory and cost before running it.

    profile.py      a hardware profile (measured by ``calibrate.py`` or from spec sheets)
    compute.py      one layer's forward/backward: roofline of FLOPs and bytes + overhead
    memory.py       model state per rank (params, grads, optimizer, masters per ZeRO stage)
    activations.py  activation memory (Korthikanti et al. 2022; minipar's own count)
    comm.py         tp / dp / ZeRO / pp communication, only the exposed part counted
    pipeline.py     the bubble, from the schedule simulator fed with stage times
    host.py         ranks sharing a host's cores: the step's bound, the slowdown
    bucket_size.py  the gradient bucket sizes a run chooses among, and the rule
    estimate.py     one layout: step time, tokens/s, MFU, memory per rank (and its bucket)
    plan.py         every valid layout, ranked (``minipar plan``, ``train --layout auto``)
    models.py       models beyond the byte vocabulary, for planning; published runs

Measuring (``minipar calibrate``):

    calibrate.py         the command: this machine's compute rates into a profile
    calibrate_model.py   on the model itself: per-op overhead, the pass over its ops'
                         sum, ZeRO-3's cost per unit
    calibrate_curves.py  collective seconds against bytes, for ``comm.py``
    calibrate_links.py   the links' α, β, γ (and between nodes) and the measured
                         winners, for ``comm/cost_model.py`` (what ``auto`` chooses by)
"""
