"""tools/kcp_bytes.py, small: every op of a rank's call is charged to the line of cake.kcp that
issued it, the products' bytes are their operands' and results' (and, in place, the addend's
copy), and twice the tokens in the same documents split a line into its part per token and its
part per document."""

import importlib.util
import pathlib

import pytest

TOOL = pathlib.Path(__file__).resolve().parents[2] / "tools" / "kcp_bytes.py"
spec = importlib.util.spec_from_file_location("kcp_bytes", TOOL)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)

DOCS = [512, 1024, 1536]  # 8 pieces each at W = 4: spans of whole chunks, no padding rows
BATCHED, IN_PLACE = 1 << 30, 1  # the plan's long-span threshold: every span batched, or a run


def by_op(counted, op):
    return sum(b for (where, name), b in counted.items() if name.startswith(op)
               and where.startswith("kcp/ops.py"))


@pytest.mark.parametrize("long_rows", [BATCHED, IN_PLACE])
def test_lines_and_products_are_counted(long_rows):
    tokens, _, counted = tool.one_rank(DOCS, 1, long_rows)
    assert tokens > 0
    assert any(where.startswith("kcp/") for where, _ in counted)
    # o = o_0 + O_M S_in: at least O_M [T, HV, K] and o_0, o_s [T, HV, V] in bf16
    rows = tokens * tool.HV_RUN * tool.V * 2
    assert by_op(counted, "baddbmm") >= 3 * rows
    assert by_op(counted, "bmm") >= 2 * rows  # C = O_M^T dout


@pytest.mark.parametrize("long_rows, rows", [(BATCHED, 3), (IN_PLACE, 5)])
def test_per_token_and_per_document_parts_split(long_rows, rows):
    """Twice the tokens in the same documents and segments: o's product adds exactly `rows` bf16
    [HV, V] rows a token (S_in is per segment): batched, O_M, o_0 and the result; in place, O_M,
    o_0, and o written with o_0, read and written with the sum."""
    t1, s1, small = tool.one_rank(DOCS, 1, long_rows)
    t2, s2, large = tool.one_rank([2 * d for d in DOCS], 1, long_rows)
    per_token = (by_op(large, "baddbmm") - by_op(small, "baddbmm")) / (t2 - t1)
    assert t2 == 2 * t1 and s1 == s2 and per_token == rows * tool.HV_RUN * tool.V * 2
