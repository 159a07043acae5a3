"""The embedding table kept as int8 with a float32 scale per 32 values (model/quant_embedding.py): exact for
a table that was Q8_0 (bf16 of d·q, d an fp16 scale per block, the block's largest |q| 127), refused for
one that was not."""

from __future__ import annotations

import torch

from kvadmit.model.quant_embedding import Int8GroupEmbedding, exact_int8_groups, int8_group_rows


def q8_0_table(rows: int, cols: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8, the bf16 table bf16(d·q)) as a GGUF Q8_0 tensor converted to bf16 gives it."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(-127, 128, (rows, cols // 32, 32), generator=g)
    q[..., 5] = torch.where(torch.rand(rows, cols // 32, generator=g) < 0.5, 127, -127)  # a full-scale value
    d = (torch.rand(rows, cols // 32, 1, generator=g) * 0.02 + 1e-4).half().float()
    return q.view(rows, cols).to(torch.int8), (d * q).view(rows, cols).to(torch.bfloat16)


def test_a_q8_0_table_comes_back_bit_for_bit() -> None:
    q, table = q8_0_table(300, 96)
    found = exact_int8_groups(table)
    assert found is not None
    q2, scales = found
    assert q2.dtype == torch.int8 and scales.dtype == torch.float32 and scales.shape == (300, 3)
    assert torch.equal(q2, q)
    rows = int8_group_rows(q2, scales, torch.arange(300))
    assert rows.dtype == torch.bfloat16 and torch.equal(rows.view(torch.int16), table.view(torch.int16))


def test_rows_by_index_and_the_embedding_module() -> None:
    _, table = q8_0_table(50, 64, seed=1)
    found = exact_int8_groups(table)
    assert found is not None
    index = torch.tensor([[3, 0, 49], [7, 7, 1]])
    assert torch.equal(int8_group_rows(*found, index), table[index])  # [2, 3, 64], as table[index]
    embedding = Int8GroupEmbedding(*found)
    assert torch.equal(embedding(torch.tensor([4, 2])), table[[4, 2]])
    # 1 byte a value and 4 bytes per 32 (the bf16 table: 2 bytes a value)
    assert sum(b.numel() * b.element_size() for b in embedding.buffers()) == 50 * 64 + 50 * 2 * 4


def test_a_table_that_was_not_q8_0_is_refused() -> None:
    g = torch.Generator().manual_seed(2)
    assert exact_int8_groups(torch.randn(64, 64, generator=g).to(torch.bfloat16)) is None
    _, table = q8_0_table(8, 64)
    assert exact_int8_groups(table.float()) is None  # float32: not the bf16 values this reproduces
    assert exact_int8_groups(table[:, :48]) is None  # rows that do not split into groups of 32


def test_a_table_of_more_rows_than_a_block_of_conversion_and_a_zero_group() -> None:
    _, table = q8_0_table(1024 + 10, 32, seed=3)
    table[1030] = 0  # an all-zero group: scale 0
    found = exact_int8_groups(table)
    assert found is not None
    assert torch.equal(int8_group_rows(*found, torch.arange(1034)), table)
    assert not found[0][1030].any()  # its q: all 0
