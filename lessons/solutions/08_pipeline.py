"""Solutions of lesson 08's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "build_1f1b": r'''
def my_1f1b(pp, m):
    schedule = {}
    for rank in range(pp):
        warmup = min(pp - rank - 1, m)
        actions = [Action("F", i) for i in range(warmup)]
        for i in range(m - warmup):                      # steady state: one F, one B
            actions += [Action("F", warmup + i), Action("B", i)]
        actions += [Action("B", i) for i in range(m - warmup, m)]   # cool-down
        schedule[rank] = actions
    return schedule
''',
    "simulate_bubble": r'''
def my_bubble(schedule, pp, t_f, t_b):
    cost = {"F": t_f, "B": t_b}
    end, clock = {}, {r: 0.0 for r in schedule}
    nxt = {r: 0 for r in schedule}
    busy = {r: 0.0 for r in schedule}
    remaining = sum(len(a) for a in schedule.values())
    while remaining:
        progressed = False
        for r, actions in schedule.items():
            while nxt[r] < len(actions):
                action = actions[nxt[r]]
                deps = dependencies(r, action, pp)
                if any(d not in end for d in deps):
                    break                                  # wait for another rank
                start = max([clock[r]] + [end[d] for d in deps])
                end[(r, action)] = clock[r] = start + cost[action.kind]
                busy[r] += cost[action.kind]
                nxt[r] += 1
                remaining -= 1
                progressed = True
        assert progressed, "deadlock: no rank can start its next action"
    makespan = max(clock.values())
    return makespan, 1 - sum(busy.values()) / (pp * makespan)
''',
    "stage_executor": r'''
%%writefile {MINE}/stage.py
"""Your 1F1B stage executor (lesson 08): run under mpiexec by 08_yours.py."""
from minipar.backend import xp


def run_stage(comm, stage, actions):
    """Run this rank's F and B actions in order, passing activations forward and
    gradients backward between neighbouring stages."""
    prev, nxt = comm.rank - 1, comm.rank + 1
    stash = {}                                  # micro-batch -> what its backward needs
    for action in actions:
        i = action.microbatch
        if action.kind == "F":
            if stage.first:
                x = stage.input(i)
            else:
                x = xp.empty(stage.shape)
                comm.recv(x, prev)
            y, saved = stage.forward(x, i)
            if stage.last:
                stash[i] = (saved, stage.loss(i, y))   # the loss's gradient starts backward
            else:
                comm.send(y, nxt)
                stash[i] = (saved, None)
        else:
            saved, dy = stash.pop(i)            # dropped: its memory goes
            if not stage.last:
                dy = xp.empty(stage.shape)
                comm.recv(dy, nxt)
            dx = stage.backward(saved, dy, i)
            del saved
            if not stage.first:
                comm.send(dx, prev)
''',
}
