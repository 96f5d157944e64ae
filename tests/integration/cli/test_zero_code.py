"""``fastprof run``'s ZeroCode in-process: the optimizer hook and the
DataLoader patch on a real Profiler, removed by ``uninstall`` and working
again after a new ``install`` (as benches/bench_run.py uses it)."""

from __future__ import annotations

from pathlib import Path

import pytest

import fastprof
from fastprof.run import ZeroCode


def test_install_uninstall_install_records_steps_each_time(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(torch.randn(5, 2), batch_size=1)
    original = torch.utils.data.DataLoader.__iter__
    prof = fastprof.Profiler(tmp_path, "zero", torch=False, sample_hz=0, merge=False, triggers=False)
    prof.start()
    zero = ZeroCode(prof)

    def one_pass() -> None:
        for x in loader:
            model(x).sum().backward()
            opt.step()

    try:
        for round_ in range(1, 4):
            zero.install()
            assert torch.utils.data.DataLoader.__iter__ is not original
            one_pass()
            zero.uninstall()
            assert torch.utils.data.DataLoader.__iter__ is original
            assert prof.batch == 5 * round_, round_
        one_pass()  # uninstalled: nothing more is counted
        assert prof.batch == 15 and zero.optimizer_steps == 15
    finally:
        zero.uninstall()
        prof.stop()
