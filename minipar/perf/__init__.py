"""The performance model: predict a layout's step time, memory and cost before running it.

    profile.py      a hardware profile (measured by ``calibrate.py`` or from spec sheets)
    compute.py      one layer's forward/backward: roofline of FLOPs and bytes + overhead
    memory.py       model state per rank (params, grads, optimizer, masters per ZeRO stage)
    activations.py  activation memory (Korthikanti et al. 2022; minipar's own count)
    comm.py         tp / dp / ZeRO / pp communication, only the exposed part counted
    pipeline.py     the bubble, from the schedule simulator fed with stage times
    estimate.py     one layout: step time, tokens/s, MFU, memory per rank
    plan.py         every valid layout, ranked (``minipar plan``, ``train --layout auto``)
"""
