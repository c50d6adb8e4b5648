"""Bulk embedding of corpora: streaming, sharded, resumable Parquet output, several servers.

* :mod:`~.sources`: text files, JSON Lines and Parquet read in chunks, each record with an id;
* :mod:`~.pool_embedder`: batches embedded over one or several servers (the transport's pool);
* :mod:`~.kinds`: what is written per model kind (an ``embedding`` or a ``sparse`` column);
* :mod:`~.shards`: Parquet shards and the manifest, written atomically;
* :mod:`~.verify`: ``triton-embed verify``, an output folder checked;
* :mod:`~.settings`: a job's settings and the identity a resumed run must match;
* :mod:`~.job`: ``triton-embed embed INPUT -o OUT_DIR``, resumable;
* :mod:`~.ray_data`: the same on a Ray cluster (``Dataset.map_batches``).

Guide: docs/bulk.md.
"""
