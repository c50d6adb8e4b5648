"""What talks to a Triton server: one transport for the client library, bulk job and gateway.

One job per module:

* :mod:`~.addresses`: ``host:port`` of one server, the pool's entries and their DNS names;
* :mod:`~.failures`: what went wrong on a call, read once into an error kind
  (:func:`~.failures.classify`), and the asynchronous transport's error;
* :mod:`~.upstreams`: the pool of servers: health checks, least-outstanding choice, one
  retry elsewhere; :mod:`~.observer`: what it reports, to whoever watches;
* :mod:`~.catalog`: the embedding ensembles the servers serve, from their configs;
* :mod:`~.inference`: pieces sent concurrently within a token budget, reassembled in order;
* :mod:`~.calls`: the client library's cancellable gRPC calls of one ``embed`` call.

The wire format (``EMBEDDING``, token IDs, KServe v2 ``BYTES`` framing) is
:mod:`triton_embed.codec`. Nothing here imports the server package.
"""
