# lightning-srifty: two commands from a fresh clone.
#   make test   set up .venv and run the test suite
#   make demo   set up .venv and run the main job on the local backend
# GPU users: make TORCH_SPEC='torch==2.13.0' TORCH_INDEX='--index-url https://download.pytorch.org/whl/cu126'
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
PY := $(VENV)/bin/python
STAMP := $(VENV)/.srifty-installed
export SKYPILOT_DISABLE_LOCAL_API_SERVER := 1
export SKYPILOT_DISABLE_USAGE_COLLECTION := 1

.PHONY: setup test demo bench lint typecheck clean default-calibration

setup: $(STAMP)

$(STAMP): pyproject.toml
	@command -v rsync >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq rsync) || echo "warning: rsync missing; SkyPilot dry-run tests will skip"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_INDEX) "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[launch,plot,dev]"
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q -p no:cacheprovider

# The demo replays a real spot trace (preemptions) when ../shared/data is beside the clone.
DEMO_TRACE ?= ../shared/data/spot-traces/preemption-1node-p3.2xlarge-2023-04/us-east-1c_v100_1.json
# Each run gets its own folder, srifty_runs/train_digits-<time>; earlier runs are kept.
DEMO_ARGS ?= --backend local --yes --target-steps 6000

demo: setup
	@if [ -f "$(DEMO_TRACE)" ]; then preempt="--preempt-trace $(DEMO_TRACE) --time-scale 1800"; \
	else echo "($(DEMO_TRACE) not found: preempting after every 8 s of training instead)"; preempt="--preempt-every 8s"; fi; \
	$(VENV)/bin/srifty-launch examples/train_digits.py $(DEMO_ARGS) $$preempt

# Refits the calibration shipped in the package on every shared trace set (maintainers;
# needs ../shared/data). The file records each set's name below SHARED_DATA.
SHARED_DATA ?= ../shared/data
DEFAULT_SETS ?= pollux-traces sia-traces/dgx-ext sia-traces/quad
default-calibration: setup
	$(VENV)/bin/srifty calibrate --data-root $(SHARED_DATA) \
		$(foreach s,$(DEFAULT_SETS),--traces $(SHARED_DATA)/$(s)) \
		--out lightning_srifty/data/default_calibration.json

bench: setup
	for b in benchmarks/bench_*.py; do $(PY) $$b || exit 1; done

lint: setup
	$(VENV)/bin/ruff check lightning_srifty tests benchmarks examples
	$(VENV)/bin/ruff format --check lightning_srifty tests benchmarks examples

typecheck: setup
	$(VENV)/bin/mypy lightning_srifty

clean:
	rm -rf $(VENV) build *.egg-info
