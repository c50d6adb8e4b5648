"""The HTTP gateway: OpenAI's and TEI's embedding APIs in front of Triton embedding ensembles.

A separate process (``triton-embed gateway``, ``python -m triton_embed_server.gateway``,
``GATEWAY_PORT=... scripts/serve.sh``) that speaks the APIs RAG frameworks already use and
calls the ensembles over gRPC (``tritonclient.grpc.aio``), balanced over several Triton
servers. One job per module:

* :mod:`~.settings`: the settings, parsed once; :mod:`~.command`: the command line, uvicorn;
  :mod:`~.protocol`: uvicorn's HTTP protocol with a request-header timeout;
* :mod:`~.app`: the Starlette app, what every request goes through;
* :mod:`~.openai_api`: ``/v1/embeddings``, ``/v1/models``;
  :mod:`~.tei_api`: ``/embed``, ``/tokenize``, ``/info``, ``/health``;
* :mod:`~.body`: the body: declared JSON, bounded in size, time and nesting;
  :mod:`~.inputs`: inputs and options, checked;
* :mod:`~.inference`: pieces of ``max_batch_size`` sent concurrently within the request's
  token budget, reassembled in order, cancelled with the request;
* :mod:`~.tensors`: gRPC tensors built and read (raw bytes, no parsing);
* :mod:`~.addresses`: the ``--upstream`` entries and their DNS names;
* :mod:`~.upstreams`: health checks, least-outstanding choice, one retry;
* :mod:`~.catalog`: the embedding ensembles from the upstreams' configs, and their aliases;
* :mod:`~.errors`: one error hierarchy, its statuses and both APIs' envelopes;
* :mod:`~.auth`: the API key; :mod:`~.metrics`: the gateway's Prometheus families.

Guide: docs/operations.md, "Gateway".
"""
