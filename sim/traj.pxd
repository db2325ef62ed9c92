# Typed layout of rlsched.sim.traj.SimTraj when the package is built with Cython (see
# traj.py; keep the two field lists in step). Without a build, traj.py runs as is.
cimport cython


@cython.final
cdef class SimTraj:
    cdef public object tid, ts, callbacks
    cdef public Py_ssize_t widx, first, n_turns
    cdef public bint truncated, mid_turn, kv_cached, in_env, sandbox, waiting_sandbox
    cdef public long long ctx, charged, prompt_kept, output_kept, generated, wasted
    cdef public long long turn_progress, turn_version, env_token, join_token, timer_token
    cdef public long long fault_hits, pending_out, moved_from
    cdef public double moved_at, hung, prefill_end
