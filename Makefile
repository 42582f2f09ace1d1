# `make demo` and `make test` do all set-up on a fresh machine.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU-only machine must not pull a multi-GB CUDA build of torch: pin the CPU wheel first.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.kreg-installed

.PHONY: demo test install lint bench-select clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q --disable-pip-version-check -e ".[test,plot,dev,daemon]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

test: lint
	$(BIN)/python -m pytest -q -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check registry backends plugins cli.py tests benchmarks examples/demo.py examples/demo_interpreter.py
	$(BIN)/mypy

bench-select: $(STAMP)
	$(BIN)/python benchmarks/bench_select.py

clean:
	rm -rf $(VENV)
