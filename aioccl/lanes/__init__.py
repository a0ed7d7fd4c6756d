"""The door and the lanes: which road an op takes, decided in one place (``door.py``).

A public op builds nothing and decides nothing: it calls the communicator's ``Door``, which offers the call
to the lanes in ``door.ORDER`` and returns the first ``Work`` one gives:

- ``cpu.py``: the CPU lane (host buffers on a same-host communicator, in C from the call to the done Work);
- ``pair.py``: the point-to-point lane (eager messages over same-host pairs' FIFOs, in C);
- ``gpu.py``: the GPU lane (a device-path collective seen before, launched from C);
- ``general.py``: the general way (full checks, a schedule, the engine): takes whatever the others decline.

Each lane answers with a ``Work``, a ``Declined`` naming its reason, or a ``Handover`` (``native/answers.py``);
``call.py`` is the record the door makes once when the first lane's native entry declines.
"""
