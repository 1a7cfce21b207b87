"""The emulated replica: an OpenAI-compatible HTTP server that paces its replies as a replica of
a given speed would, and speaks the load endpoints of the engine it emulates (``hetero
mock-replica``; ``hetero.testing.MockReplica`` and ``MockConfig``, from ``server`` and
``config``).

Its routes and state call one interface, ``replica_engine.ReplicaEngine`` (run a request, read
the load, close), which two models implement: ``slots`` (each request alone in a slot, for its
own service time) and ``continuous`` (the engine model the router fits,
``hetero.serve.engine_model``, stepped on the event loop). ``tiny_llama`` stands apart: the tiny
local Llama a real engine serves (``hetero mock-model``).
"""
