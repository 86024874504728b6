"""The fast path's choices that need no model: which dtypes a CPU is allowed, read from its flags."""

from __future__ import annotations

import pytest
import torch

from specbench.core.errors import SpecbenchError
from specbench.decoding.target import cpu_flags, resolve_dtype
from tests.helpers import invoke

CPU = torch.device("cpu")


def test_bfloat16_on_a_cpu_needs_avx512_bf16_or_amx():
    with pytest.raises(SpecbenchError, match="neither AVX512-BF16 nor AMX"):
        resolve_dtype("bfloat16", CPU, frozenset({"avx2", "fma"}))
    assert resolve_dtype("bfloat16", CPU, frozenset({"avx2", "avx512_bf16"})) is torch.bfloat16
    assert resolve_dtype("bfloat16", CPU, frozenset({"amx_bf16"})) is torch.bfloat16
    assert resolve_dtype("bfloat16", torch.device("cuda"), frozenset()) is torch.bfloat16
    assert resolve_dtype("float32", CPU, frozenset()) is torch.float32


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu avx2 amx_bf16\nbugs\t\t: none\n")
    assert cpu_flags(str(info)) == {"fpu", "avx2", "amx_bf16"}
    assert cpu_flags(str(tmp_path / "absent")) is None


@pytest.mark.skipif(bool((cpu_flags() or frozenset({"avx512_bf16"})) & {"avx512_bf16", "amx_bf16"}),
                    reason="this CPU runs bfloat16 natively")
def test_run_refuses_bfloat16_here_in_one_line(tmp_path):
    result = invoke("run", "--dtype", "bfloat16", "--device", "cpu", "--limit", "1", "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert "neither AVX512-BF16 nor AMX" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
