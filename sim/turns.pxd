# Typed locals of rlsched.sim.turns when the package is built with Cython (see turns.py).
cimport cython

from .core cimport DriverCore
from .engine cimport EngineSim
from .traj cimport SimTraj


@cython.locals(eng=EngineSim, t=SimTraj, now=double, at=double)
cpdef wake_timer(DriverCore d, object ev)

@cython.locals(i=Py_ssize_t, row=Py_ssize_t, p=cython.longlong, o=cython.longlong,
               v0=cython.longlong, token=cython.longlong, delay=double)
cpdef turn_done(DriverCore d, SimTraj t, EngineSim eng)

@cython.locals(t=SimTraj, eng=EngineSim, now=double, token=cython.longlong, i=Py_ssize_t,
               row=Py_ssize_t, p=cython.longlong, o=cython.longlong, need=cython.longlong,
               new=cython.longlong, cached=cython.longlong)
cpdef env_timer(DriverCore d, object ev)

@cython.locals(now=double, since=double, i=Py_ssize_t, code=int)
cpdef engine_touch(DriverCore d, EngineSim eng)
