# Two commands do everything on a fresh machine: `make serve` and `make test`.
# Both create and use the virtual environment at .venv in the checkout.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# Versions tested on CPU machines; set CONSTRAINTS= to keep your own CUDA build of torch.
CONSTRAINTS ?= constraints/cpu.txt
MODELS ?= models
PYTEST_ARGS ?=

.PHONY: setup models serve rollout test bench clean

$(VENV)/.installed: pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install $(if $(CONSTRAINTS),-c $(CONSTRAINTS)) -e '.[test]'
	touch $@

setup: $(VENV)/.installed

$(MODELS)/.built: | $(VENV)/.installed
	$(PY) -m clients.cli make-models $(MODELS)
	touch $@

models: $(MODELS)/.built

# The whole app on the tiny built-in models (built into $(MODELS)/ on first start), `serve run` behind
# HAProxy with direct ingress where the binary exists (deployments/fast_ingress.py; RTV_INGRESS=proxy: Serve's proxy).
serve: setup
	$(PY) -m deployments.fast_ingress serve_config.yaml

rollout: setup models
	$(PY) -m clients.cli rollout --model $(MODELS)/world-model \
		--prompt "a lighthouse on a cliff at dawn" \
		--action-script examples/actions.json --output-dir out/rollout

# pytest exits 5 when it collects nothing: that is a failure, not a pass.
test: setup
	HF_HUB_OFFLINE=1 $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$rc

# The benchmark suite (README, "Benchmarks"): one JSON on stdout, also written to bench/results/cpu.json.
bench: setup
	HF_HUB_OFFLINE=1 $(PY) -m bench.run_all --models $(MODELS)

clean:
	rm -rf $(MODELS) out
