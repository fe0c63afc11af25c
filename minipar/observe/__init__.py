"""What a run tells about itself: while it runs, in its log, and afterwards.

    monitor.py          what did each step cost, on every rank?  ``RunMonitor``: one small
                        gather per step to rank 0, the progress bar, the JSON log (its
                        format: docs/log-format.md), MFU
    monitor_text.py     what does a person read?  the header before the first step and the
                        summary after the last
    progress.py         how far along?  a bar on a terminal, a line every few seconds in a file
    procmem.py          what does the process hold?  its peak resident memory per phase
                        (construction, steps, save), and on CuPy the pool and the device
    resources.py        what does this rank's machine offer?  its GEMM rate, its memory
                        budget, its GPU's NVML handle
    runlog.py           what did a run log?  a ``--log-json`` file read back: header, step
                        records, events, final
    report.py           ``minipar report``: plots and an HTML page of one or more logs,
                        each read into a run by ``report_runs.py``
    profiler.py         ``minipar profile``: where does a step's time go?  by op and phase,
                        against this machine's roofline; its tables in ``profiler_report.py``

``train`` writes with the first five; ``runlog`` reads what they wrote; ``report`` and
``profile`` are commands.  ``profile`` sets a run up as ``train`` does, so only the command
line imports it: nothing that ``train`` builds on depends on it.
"""
