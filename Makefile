# Two set-up commands (see README): `make run` and `make test`. Both install first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
# llama.cpp is compiled from llama-cpp-python's sdist for this CPU; switch off what the app never uses.
# AMX is left out: some virtual machines report AMX but fault on its first instruction (SIGILL in
# ggml_backend_amx_mul_mat), and explicit -mno-* flags win over -march=native.
export CMAKE_ARGS ?= -DLLAVA_BUILD=OFF -DMTMD_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF
NO_AMX := -mno-amx-tile -mno-amx-int8 -mno-amx-bf16
LLAMA_CPP := llama-cpp-python==0.3.36

.PHONY: install run test demo bench package clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	# The CPU build of torch; pinned so that nothing pulls a CUDA build.
	$(PY) -m pip install --quiet torch==2.13.0
	# Built here with the flags above, never a cached wheel built with other flags or for another CPU.
	CFLAGS="$(NO_AMX)" CXXFLAGS="$(NO_AMX)" $(PY) -m pip install --quiet --no-cache-dir --force-reinstall --no-deps $(LLAMA_CPP)
	$(PY) -m pip install --quiet -e '.[test,package]'
	touch $@

# Opens the GUI where there is a display; with none, runs the headless demo.
run: install
	$(PY) -m app run

demo: install
	$(PY) -m app demo

test: install
	QT_QPA_PLATFORM=offscreen $(PY) -m pytest -ra

# The one-folder app, a .tar.gz and a .deb in dist/ (see packaging/README.md).
package: install
	$(PY) -m pip install --quiet -e '.[package]'
	PY=$(PY) bash packaging/build_linux.sh

clean:
	rm -rf $(VENV) build dist
