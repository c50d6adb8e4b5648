"""The bulk job's ``tokens`` column: TokenMatrices, the shard table, verify, the options."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from triton_embed.bulk import shards
from triton_embed.bulk.kinds import TokenMatrices, request_options
from triton_embed.errors import InvalidInputError
from triton_embed.multivector_options import MultiVectorOptions
from triton_embed.options import RequestOptions
from triton_embed.sparse_options import SparseOptions
from triton_embed.transport.catalog import ModelKind


def matrices(seed=0, lengths=(3, 1, 4), dim=5):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, dim)).astype(np.float32) for n in lengths]


def test_token_matrices_hold_the_rows_in_order_and_concatenate():
    a, b = TokenMatrices.from_matrices(matrices(0)), TokenMatrices.from_matrices(matrices(1, (2,)))
    joined = TokenMatrices.concatenate([a, b])
    assert len(joined) == 4 and joined.dim == 5
    for r, want in enumerate(matrices(0) + matrices(1, (2,))):
        np.testing.assert_array_equal(joined.row(r), want)
    with pytest.raises(ValueError, match="different dimensions"):
        TokenMatrices.from_matrices([np.zeros((1, 2), np.float32), np.zeros((1, 3), np.float32)])


def test_a_tokens_shard_round_trips_through_arrow():
    schema = shards.tokens_schema("int64", 5, include_text=False)
    assert schema.field("tokens").type == pa.list_(pa.list_(pa.float32(), 5))
    parts = [TokenMatrices.from_matrices(matrices(0)), TokenMatrices.from_matrices(matrices(1))]
    table = shards.table(schema, list(range(6)), np.array([3, 1, 4, 3, 1, 4]), parts)
    assert shards.vector_column(table.schema) == "tokens"
    back = shards.read_tokens(table.column("tokens"))
    for r, want in enumerate(matrices(0) + matrices(1)):
        np.testing.assert_array_equal(back.row(r), want)


def test_the_multivector_options_refuse_the_other_kinds_flags():
    opts = request_options(ModelKind.MULTIVECTOR, "colbert", RequestOptions(input_type="query"),
                           SparseOptions())  # fmt: skip
    assert opts == MultiVectorOptions(input_type="query")
    with pytest.raises(InvalidInputError, match=r"--dimensions do not apply to a multi-vector"):
        request_options(ModelKind.MULTIVECTOR, "colbert", RequestOptions(dimensions=8),
                        SparseOptions())  # fmt: skip
    with pytest.raises(InvalidInputError, match=r"--top-k do not apply"):
        request_options(ModelKind.MULTIVECTOR, "colbert", RequestOptions(), SparseOptions(top_k=3))
    with pytest.raises(InvalidInputError, match=r"input_type='passage' must be one of"):
        request_options(ModelKind.MULTIVECTOR, "colbert", RequestOptions(input_type="passage"),
                        SparseOptions())  # fmt: skip
