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
}
