# Typed fields of rlsched.sim.core.DriverCore (the simulator's rollout core) when the
# package is built with Cython (see core.py): the ones the per-turn code in turns.py reads
# and writes, and its references to the collaborators it calls (roles, faults). The core's
# other attributes live in the instance __dict__ (declared so that Cython keeps one).
cimport cython

from .engine cimport EngineSim
from .traj cimport SimTraj


cdef class DriverCore:
    cdef dict __dict__
    cdef public double now
    cdef public long long events_processed, sandbox_free, max_seqs
    cdef public dict seq_wait
    cdef public object env, roles, faults, rec, gpus, _eid, _events, sandbox_queue
    cdef public object _env_callbacks, _wake_callbacks
    cdef public list _queue
    cdef public dict engines
    cdef public double[::1] gpu_busy
    # the workload's per-turn arrays (SimTraj.first + turn)
    cdef public const long long[::1] w_prompt, w_output
    cdef public const double[::1] w_env
    # RunRecorder.interval_buffers (valid when iv_on)
    cdef public bint iv_on
    cdef public Py_ssize_t iv_cap
    cdef public int[::1] iv_first, iv_count, iv_step
    cdef public double[::1] iv_start, iv_end
    cdef public signed char[::1] iv_state
    cdef public long long[::1] iv_n

    cpdef run_until(self, object until)

    @cython.locals(callbacks=object, t=SimTraj, eng=EngineSim, now=double)
    cpdef _step_until(self, object env, list queue, object until)
