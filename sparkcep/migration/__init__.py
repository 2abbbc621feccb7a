"""Live migration: Megaphone's bin moves, UPM-CEP's State Transfer and live rescaling (DESIGN §5).

A small library over the runtime's hooks — control records applied at an
epoch (``Export``, ``Configure``, ``Import``, ``Retire``), the stateful
operators' bin extract/install, and generations of a deployment
(:mod:`sparkcep.runtime.deployment`):

* :mod:`.plan` — which bins move where, cut into steps by strategy;
* :mod:`.megaphone` — a step's records, sent into every replica at one epoch;
* :mod:`.state_transfer` — instances moved (or added, removed) by a generation switch;
* :mod:`.migrator` — the checked public operations, ``migrate``, ``move``, ``rescale``;
* :mod:`.report` — what each reports: bins, bytes, steps, duration, latency meanwhile;
* :mod:`.balancer` — automatic balancing (``deploy(..., balance=True)``).
"""
