"""The hang-timeout watchdog ends a stuck job, naming who waits for whom (under mpiexec).

    comm_watchdog.py blocking   set_hang_timeout(1), check mode off: a wait shorter than
                                the timeout passes; then rank 0 sleeps inside its turn of a
                                ring all-reduce, and rank 1 (waiting in MPI) reports, aborts
    comm_watchdog.py async      Communicator(hang_timeout=1), check mode on: the same, the
                                wait happening on rank 1's progress thread (in the argument
                                agreement) while its main thread waits on the handle
"""
import sys
import time

import numpy as np

from minipar.comm import Communicator, all_reduce, all_reduce_async, set_hang_timeout

mode = sys.argv[1]
if mode == "blocking":
    set_hang_timeout(1.0)
    comm = Communicator(check=False)
else:
    comm = Communicator(check=True, hang_timeout=1.0)
x = np.ones(10, np.float32)
if comm.rank == 0:
    time.sleep(0.5)  # slow, but under the timeout: no report
all_reduce(comm, x, algorithm="ring")
all_reduce_async(comm, x).wait()  # sets up the progress thread while everyone is here
print(f"rank {comm.rank}: waits under the timeout passed", flush=True)
if comm.rank == 0:
    time.sleep(60)  # stuck inside its turn: never reaches the collective in time
elif mode == "blocking":
    all_reduce(comm, x, algorithm="ring")
else:
    all_reduce_async(comm, x, algorithm="recursive_doubling").wait()
print("unreachable: the watchdog did not end the job", flush=True)
