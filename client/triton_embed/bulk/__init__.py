"""Bulk embedding of corpora: streaming, sharded, resumable Parquet output, several servers.

* :mod:`~.sources`: text files, JSON Lines and Parquet read in chunks, each record with an id;
* :mod:`~.pool_embedder`: batches embedded over one or several servers (the transport's pool);
* :mod:`~.shards`: Parquet shards and the manifest, written atomically; :func:`~.shards.verify`;
* :mod:`~.job`: ``triton-embed embed INPUT -o OUT_DIR``, resumable;
* :mod:`~.ray_data`: the same on a Ray cluster (``Dataset.map_batches``).

Guide: docs/bulk.md.
"""
