#!/bin/sh
# Lesson 05's overlapped DDP (the solution of my_ddp) against the same class blocking in
# its hooks, on the simulated cluster: 2 nodes x 1 rank, 0.1 Gbit/s between them.  Needs
# root, ip and tc.  From the repository root:
#
#     MACHINE="what the machine was" sh benchmarks/recorded/ddp_overlap_2026-12-08/command.sh
#
# writes timing.json beside this file: 05_yours.py --time's line (median step times of the
# slower rank), the link's rate, and MACHINE.  Lesson 05 shows it where no cluster can be built.
set -e
HERE=$(dirname "$0")
MINE=$(mktemp -d)
python -c "import runpy, sys; s = runpy.run_path('lessons/solutions/05_data_parallel.py')['SOLUTIONS']['my_ddp']
open(sys.argv[1], 'w').write(s.lstrip().partition('\n')[2])" "$MINE/ddp.py"
python -m minipar cluster down --prefix mpl05
python -m minipar cluster up --prefix mpl05 --nodes 2 --ranks-per-node 1 --inter-gbps 0.1
python -m minipar cluster run --prefix mpl05 -- lessons/05_yours.py --file "$MINE/ddp.py" --time 20 > "$MINE/out.txt" \
    || { python -m minipar cluster down --prefix mpl05; cat "$MINE/out.txt"; exit 1; }
python -m minipar cluster down --prefix mpl05
python -c "import json, sys; line = [l for l in open(sys.argv[1]) if l.startswith('{')][-1]
t = dict(json.loads(line), inter_gbps=0.1, machine=sys.argv[2])
json.dump(t, open(sys.argv[3], 'w'), indent=1); print(t)" "$MINE/out.txt" "${MACHINE:-unknown}" "$HERE/timing.json"
