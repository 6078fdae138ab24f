"""Routing to the owner of live objects, when several replicas serve one endpoint.

What cannot move between replicas (a parked legacy call, a server-to-client request awaiting a
legacy client's answer) stays on the process that made it. The tokens a client echoes back name
that process, sealed: its boot id (random, per process) and the address other replicas reach its
internal listener at. The replica an echo lands on forwards ("replays") the client's request
there, over the one internal endpoint `POST /_mep/v1/replay`, and copies the reply back as it
comes. The target serves a replay exactly as if the client had sent it to its public endpoint.

A replay's body is an envelope sealed for the target's boot id, expiring in seconds: the internal
listener refuses whatever it did not mint (401), and a replay meant for an earlier process at the
same address (410: the call it names is gone). Addresses come only from tokens this proxy sealed,
so the forwarder can never be made to reach anywhere else.

Modules: owners.py (boot ids, sealed tokens naming their owner), envelope.py (what a replay
carries), forward.py (the replica that replays), replay.py (the owner's internal listener),
workers.py (--workers: several processes of one host as replicas). Imported only by the
downstream edge and the composition root.
"""
