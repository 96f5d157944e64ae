#!/usr/bin/env bash
# Builds .bench-venv: the real peer profilers (Composer, Lightning) for benches/bench_loop.py,
# on top of the dev venv's torch, without a second torch.
#
# mosaicml (Composer) pins torch<2.7.1 and torchvision<0.22.1; honouring those pins would
# download a second CUDA torch (GBs) and measure the peers on another torch than fastprof.
# Instead .bench-venv is a plain venv whose site-packages ends with the dev venv's (a .pth
# line, appended after its own, so what is installed here shadows the dev venv and nothing
# here can change it); Composer goes in with --no-deps plus the few pure-Python packages
# its import path needs (found by importing composer.profiler until it imported), and one
# torchvision wheel, --no-deps (Composer imports torchvision.transforms at import time).
# Lightning comes from the dev venv when it is there (pip sees it through the .pth line).
#
# Usage: benches/setup_peers.sh [BASE_VENV] [BENCH_VENV]   (defaults: .venv .bench-venv)
# Then:  .bench-venv/bin/python benches/bench_loop.py
set -euo pipefail

BASE=${1:-.venv}
BENCH=${2:-.bench-venv}

# The versions measured (see the benches' docstrings). Composer's own import-path
# dependencies, each --no-deps so none of them pulls torch or numpy in.
NO_DEPS=(
    mosaicml==0.32.1
    torchvision==0.29.2
    pillow==11.3.0
    py-cpuinfo==9.0.0
    coolname==2.2.0
    tabulate==0.9.0
    importlib-metadata==8.9.0
)
# Pure Python, resolved normally against what the dev venv already has.
WITH_DEPS=(
    mosaicml-cli==0.7.5
    lightning==2.6.6
)

if [[ ! -x "$BASE/bin/python" ]]; then
    echo "setup_peers: no dev venv at $BASE (run 'make dev' first, or pass its path)" >&2
    exit 1
fi
base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
base_site=$(cd "$base_site" && pwd)

# venv from the dev venv's interpreter uses its base interpreter (same Python version).
"$BASE/bin/python" -m venv --clear "$BENCH"
bench_site=$("$BENCH/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# addsitedir, not a bare path line: the dev venv's own .pth files (fastprof's editable
# install among them) are processed too.
echo "import site; site.addsitedir('$base_site')" >"$bench_site/_dev_venv.pth"

pip=("$BENCH/bin/python" -m pip --disable-pip-version-check -q)
echo "setup_peers: pip will list mosaicml's torch/torchvision/torchmetrics pins as conflicts: expected, see above"
"${pip[@]}" install --no-deps "${NO_DEPS[@]}"
"${pip[@]}" install "${WITH_DEPS[@]}"

# Fail here, not in the bench: the peers' real profilers must import and run.
"$BENCH/bin/python" - <<'EOF'
import tempfile

import composer
import fastprof
import lightning
import torch
from composer.core import State
from composer.devices import DeviceCPU
from composer.loggers import Logger
from composer.profiler import JSONTraceHandler, Profiler, cyclic_schedule
from lightning.pytorch.profilers import SimpleProfiler

with tempfile.TemporaryDirectory() as tmp:
    state = State(model=torch.nn.Linear(2, 2), rank_zero_seed=0, run_name="check", device=DeviceCPU())
    handler = JSONTraceHandler(folder=tmp, overwrite=True)
    prof = Profiler(schedule=cyclic_schedule(skip_first=0, wait=0, warmup=0, active=10), trace_handlers=[handler],
                    sys_prof_cpu=False, torch_prof_profile_memory=False, torch_prof_with_flops=False)
    prof.bind_to_state(state)
    state.profiler = prof
    handler.init(state, Logger(state))
    with prof.marker("check"):
        pass
    assert handler._queue.qsize() == 2, "Composer's marker recorded nothing"
simple = SimpleProfiler()
with simple.profile("check"):
    pass
assert len(simple.recorded_durations["check"]) == 1
print(f"setup_peers: ok: composer (mosaicml) {composer.__version__}, lightning {lightning.__version__}, "
      f"torch {torch.__version__} from the dev venv")
EOF
touch "$BENCH/.peers"
