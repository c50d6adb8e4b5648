"""The HTTP gateway: embedding and rerank APIs in front of Triton embedding and reranker ensembles.

A separate process (``triton-embed gateway``, ``python -m triton_embed_server.gateway``,
``GATEWAY_PORT=... scripts/serve.sh``) that speaks the APIs RAG frameworks already use and
calls the ensembles over gRPC through the client package's transport
(:mod:`triton_embed.transport`: the upstream pool, its health checks, the inference call,
the model catalog, the error kinds), balanced over several Triton servers. One job per
module:

* :mod:`~.settings`: the settings, parsed once; :mod:`~.command`: the command line, uvicorn;
  :mod:`~.protocol`: uvicorn's HTTP protocol with a request-header timeout;
* :mod:`~.app`: what every request goes through (:class:`~.app.Gateway`);
  :mod:`~.routes`: the routes, and the app of the settings;
* :mod:`~.openai_api`: ``/v1/embeddings``, ``/v1/models``;
  :mod:`~.tei_api`: ``/embed``, ``/tokenize``, ``/info``, ``/health``; :mod:`~.tei_decode`:
  ``/decode``;
  :mod:`~.rerank_api`: Cohere's and Jina's ``/v1/rerank``, ``/v2/rerank``, TEI's and
  vLLM's ``/rerank``; :mod:`~.score_api`: vLLM's ``/score``; :mod:`~.pairs`: what a rerank
  or score request asks, checked, and the call that scores it; :mod:`~.kinds`: which routes
  serve which kind of model;
* :mod:`~.body`: the body: declared JSON, bounded in size, time and nesting;
  :mod:`~.inputs`: inputs and options, checked;
* :mod:`~.merging`: small concurrent requests merged into one upstream call;
* :mod:`~.folder_facts`: pooling and normalization read from a model folder on this host
  (the facts reader the gateway gives its upstream pool);
* :mod:`~.errors`: one error hierarchy, its statuses (a table over the transport's error
  kinds) and both APIs' envelopes;
* :mod:`~.auth`: the one API key; :mod:`~.tenants`: the tenants file and key lookup;
  :mod:`~.tenancy`: who a request is, its rights and rate, reloads; :mod:`~.quota`: token
  buckets; :mod:`~.fair`: the scheduler (classes, fair shares by tokens, caps);
  :mod:`~.usage`: usage and cost per tenant and hour; :mod:`~.admin_api`: ``/admin/usage``;
* :mod:`~.metrics`: the gateway's Prometheus families (the upstream pool's observer).

Guides: docs/operations.md, "Gateway"; docs/tenants.md.
"""
