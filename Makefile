# The README's two commands: `make demo` and `make test`. Both create .venv if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS := aws,sagemaker,trainer,report,local,dev
STAMP := $(VENV)/.installed
# An extra package index for torch, off by default. PyPI's Linux torch wheel is the CUDA build
# (with gigabytes of nvidia-* libraries); for the CPU-only build on a Linux laptop:
#   make install TORCH_INDEX=https://download.pytorch.org/whl/cpu   (fresh clone or after make clean)
TORCH_INDEX ?=
TORCH_INDEX_ARGS := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX))

.PHONY: demo test test-rendered docs lint compile install clean

$(STAMP): setup.cfg pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet $(TORCH_INDEX_ARGS) -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

install: $(STAMP)

compile: $(STAMP)
	$(PY) -m kfp_sagemaker_blackwell.pipelines.compile

LINT := $(VENV)/bin/ruff check . && $(VENV)/bin/mypy && \
	$(PY) -m kfp_sagemaker_blackwell.iam.lint && \
	$(VENV)/bin/hadolint images/trainer/Dockerfile images/components/Dockerfile

lint: $(STAMP)
	$(LINT)

# The tests on every core and then some (-n auto: tests/conftest.py's worker count); a test
# file's tests stay in one worker (--dist loadfile), so a module's fixtures (a local backend, a
# trained run) start once, and the files start in conftest's order (--no-loadscope-reorder).
# Lint runs beside the tests (its ~25 s of CPU fill their waits), its output after theirs;
# make test fails when either fails. tests/README.md: how to keep it fast.
test: $(STAMP)
	@lint_log="$$(mktemp)"; \
	(set -x; $(LINT)) >"$$lint_log" 2>&1 & lint_pid=$$!; \
	$(PY) -m pytest -n auto --dist loadfile --no-loadscope-reorder; tests=$$?; \
	wait $$lint_pid; lint=$$?; \
	echo "---- make lint (run beside the tests): exit $$lint ----"; cat "$$lint_log"; \
	rm -f "$$lint_log"; \
	test $$tests -eq 0 && test $$lint -eq 0

# Both HTML reports as a browser renders them: needs Debian's chromium (installed here if
# missing); `make test` runs the same file and skips it, saying why, where chromium is absent.
test-rendered: $(STAMP)
	command -v chromium >/dev/null || apt-get install -y chromium
	$(PY) -m pytest tests/test_reports_rendered.py

# The docs' generated parts (component reference, layout table, the planner's worked example)
# and their pictures (the two HTML reports as Chromium draws them, into docs/images/).
docs: $(STAMP)
	$(PY) -m kfp_sagemaker_blackwell.pipelines.compile --docs
	command -v chromium >/dev/null || apt-get install -y chromium
	DOCS_IMAGES=docs/images $(PY) -m pytest -q tests/test_reports_rendered.py

demo: compile
	$(PY) pipelines/precision_sweep.py --run-local

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
