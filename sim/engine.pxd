# Typed layout of rlsched.sim.engine.EngineSim when the package is built with Cython (see
# engine.py; keep the field list in step with its __slots__). Without a build, engine.py
# runs as is. Locals are typed so the rate arithmetic runs on C doubles, in the same
# order of operations as the Python source (the floats are identical; setup.py turns off
# floating-point contraction).
cimport cython


@cython.final
cdef class KvPool:
    cdef public long long total


@cython.final
cdef class EngineSim:
    cdef public double progress, updated, rate, stall_end, sync_end, wake_at, timer_at, gsince
    cdef public double ctx_base, target_sum, unborn
    cdef public double _weights, _kv_tok, _mem_den, _params2, _comp_den, _overhead, _pre_attn
    cdef public double _pre_den
    cdef public double _expert, _miss, _per_seq
    cdef public long long kv_reserved, kv_capacity, seq_counter
    cdef public int id, first_gpu, tp, gcode
    cdef public bint closed, owns, counted
    cdef public KvPool pool
    cdef public object version, cost, es, callbacks, gstate, eid
    cdef public object wake_callbacks
    cdef public dict members, reservations, env_lru, prefilling
    cdef public list heap, queue
    cdef public list evicted

    @cython.locals(start=double)
    cpdef advance(self, double now)

    @cython.locals(b=Py_ssize_t)
    cpdef _recompute_rate(self)

    @cython.locals(w=double, mem=double, comp=double, fixed=double)
    cdef inline double _step(self, Py_ssize_t b, double context)

    @cython.locals(start=double, prefill=double, p=double, target=double, base=double,
                   b=Py_ssize_t, seq=cython.longlong)
    cpdef double join(self, double now, object key, long long cached, long long new, double tokens)

    @cython.locals(start=double, progress=double, target=double, base=double, b=Py_ssize_t,
                   heap=list, members=dict, due=list)
    cpdef list pop_due(self, double now)

    @cython.locals(begin=double, remaining=double, at=double, heap=list, b=Py_ssize_t,
                   full=double)
    cpdef rearm(self, double now)

    @cython.locals(b=Py_ssize_t)
    cpdef double used(self, double now)

    cpdef bint overflowing(self, double now)

    cpdef double free(self, double now)

    @cython.locals(have=cython.longlong, need=cython.longlong, room=double, freed=cython.longlong)
    cpdef bint reserve(self, object key, long long tokens, long long pending, double now)
