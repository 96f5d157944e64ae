# fastprof developer commands. `make help` lists them; CI runs `make test`.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
BENCH_VENV ?= .bench-venv
RUST_SRC := $(shell find rust -name '*.rs' -o -name Cargo.toml) Cargo.toml pyproject.toml

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -E '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}'

$(PY):
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Everything the tests and lint use. uv installs it (torch and its ~3 GB of
# CUDA libraries among it) in ~90 s where pip took ~190 s on CI's machine;
# pip is the fallback where uv cannot be installed. Both compile the
# bytecode at install: where PYTHONDONTWRITEBYTECODE is set (as on CI's
# machine) nothing else ever does, and every interpreter of the suite would
# compile torch again (11.6 s of CPU to import it, 6.7 s from bytecode).
DEPS := 'maturin>=1.7,<2' 'numpy>=1.24' 'psutil>=5.9' 'nvidia-ml-py>=12' 'torch>=2.4' 'lightning>=2.2' 'HolisticTraceAnalysis>=0.5' 'rich>=13' 'plotly>=6' 'mlflow-skinny>=2' 'transformers>=4.40' 'accelerate>=0.30' \
	'pytest>=8' 'pytest-timeout>=2.3' 'pytest-xdist>=3.5' 'jsonschema>=4.18' 'websocket-client>=1.6' 'pillow>=10' 'ruff>=0.6' 'mypy>=1.11' \
	's3fs>=2026.2.0' 'moto[server]>=5' 'pyarrow>=14' 'pandas>=2' 'polars>=1' 'duckdb>=1'
$(VENV)/.deps: pyproject.toml | $(PY)
	if $(PY) -m pip install -q uv; then $(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) $(DEPS); else $(PY) -m pip install -q $(DEPS); fi
	touch $@

# The editable install is never compiled by pip: fastprof's own bytecode is
# compiled here (each job the suite starts imports fastprof; ~0.17 s of CPU
# less per import). A source changed since is compiled in memory, as before.
$(VENV)/.built: $(RUST_SRC) $(VENV)/.deps
	$(PY) -m pip install -q --no-deps --no-build-isolation -e .
	$(PY) -m compileall -q python
	touch $@

# The HTML report's test opens report.html in headless Chromium (Debian's package).
chromium: ## Install Debian's chromium for the HTML report test when missing (as root; else say how)
	@if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -q && apt-get install -y -q chromium; \
		else \
			echo "note: tests/integration/reports/test_report_html.py needs chromium: sudo apt-get install -y chromium"; \
		fi; \
	fi

dev: $(VENV)/.built chromium ## Create .venv with torch + test tools and build fastprof into it (editable)

# pytest runs a test file per worker (pytest-xdist, --dist loadfile: a module's
# fixtures, such as the exit matrix's pool of runs, stay in one process), one
# worker more than the cores up to 4: the waits of one file (signals,
# torchrun, steps that sleep) overlap another's work. Two workers kept CI's 2
# cores ~78% busy; the suite is written to pass beside a CPU hog, which is
# the load a third worker adds.
PYTEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); if [ $$n -lt 4 ]; then echo $$((n + 1)); else echo 4; fi)
test: dev ## Run every test: cargo (core) then pytest (Python, real torch on CPU)
	cargo test --workspace --exclude fastprof-py
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile

lint: dev ## No tracked artifacts; cargo fmt/clippy, ruff check/format, mypy, stub check
	.ci/check-tracked
	cargo fmt --all -- --check
	cargo clippy --all-targets -- -D warnings
	$(VENV)/bin/ruff check --no-cache python tests benches
	$(VENV)/bin/ruff format --no-cache --check python tests benches
	$(VENV)/bin/mypy
	$(PY) -m mypy.stubtest fastprof._core --allowlist .stubtest-allowlist

fmt: ## Format Rust and Python sources
	cargo fmt --all
	$(VENV)/bin/ruff format python tests benches

demo: dev ## Profile a short CNN training on synthetic data
	$(VENV)/bin/fastprof demo

$(BENCH_VENV)/.peers: benches/setup_peers.sh | $(VENV)/.deps
	benches/setup_peers.sh $(VENV) $(BENCH_VENV)

bench-env: $(BENCH_VENV)/.peers ## Create .bench-venv: Composer and Lightning on the dev venv's torch (for the benches)

bench: dev bench-env ## Run the benchmarks (peers side by side, ratios printed)
	$(BENCH_VENV)/bin/python benches/bench_loop.py
	$(PY) benches/bench_window_stall.py
	$(PY) benches/bench_span.py
	$(PY) benches/bench_writer.py
	$(PY) benches/bench_training.py
	$(PY) benches/bench_sampler.py
	$(PY) benches/bench_merge.py
	$(PY) benches/bench_lightning.py
	cargo bench -p fastprof-core

clean: ## Remove build outputs and the venv
	rm -rf target $(VENV) $(BENCH_VENV) fastprof_runs

.PHONY: help chromium dev test lint fmt demo bench bench-env clean
