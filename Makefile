# autotune — newcomer entry points:
#   make search   the main job: an autotune study on the default SQLite storage (installs what is missing)
#   make test     the fast tier of the test suite (installs what is missing); make test-all runs all of it
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.setup-done
# The IPEX runtime: intel-extension-for-pytorch 2.8.0 imports only with torch 2.8.0, so IPEX trials run
# in their own environment beside the main one (found there by autotune).
IPEX_VENV  := .venv-ipex
IPEX_STAMP := $(IPEX_VENV)/.setup-done
# Allocators and numactl for the search, and a C++ toolchain that builds llama.cpp. For the tests only: chromium opens the dashboard and the report;
# PostgreSQL and MariaDB servers are started by the tests of a study shared by several workers.
APT_PACKAGES      := libgoogle-perftools4 libjemalloc2 numactl build-essential cmake ninja-build
TEST_APT_PACKAGES := chromium postgresql mariadb-server

# The two runtimes hold about 14 GB of wheels (torch with its CUDA libraries, twice): pip keeps no second copy in
# its cache, so setup fits on a disk with less room.
export PIP_NO_CACHE_DIR := 1
# Each runtime is checked for room before pip first installs it: a disk that fills halfway through leaves a broken
# venv and pip's OSError, where one line can say what is missing. GB free on this folder's disk for the wheels (pip
# unpacks them under $$TMPDIR, here the same disk); an update of an existing runtime installs a delta, unchecked.
VENV_GB := 10
define need_disk
	@[ -x $(3)/bin/python ] && exit 0; \
	free=$$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}'); \
	case "$$free" in ''|*[!0-9]*) echo "error: cannot read the free space on this disk (df)" >&2; exit 2;; esac; \
	if [ "$$free" -lt $(1) ]; then \
		echo "error: $(2) needs about $(1) GB free on this disk and $$free GB are; free some (old clones' .venv folders, studies/.cache) and rerun" >&2; \
		exit 2; \
	fi
endef

# llama.cpp, as llama-cpp-python carries it (built from source; see the llama-cpp target)
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_SRC        := $(VENV)/share/llama.cpp-src
LLAMA_VENDOR     := $(LLAMA_SRC)/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp
LLAMA_SHARE      := $(VENV)/share/llama.cpp
LLAMA_TOOLS      := llama-bench llama-batched-bench llama-perplexity llama-server
LLAMA_PY_ARGS    := -DGGML_NATIVE=ON
LLAMA_TOOL_ARGS  := -G Ninja -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
	-DBUILD_SHARED_LIBS=OFF
# Compiled for this CPU (-march=native), the llama-cpp-python wheel and the tools are kept per machine in
# $(LLAMA_CACHE)/<version>-<key>: the key digests the CPU's flags, the compiler, CMake and the build options, so
# another clone on this machine (a CI run, a second checkout) installs them in seconds instead of compiling for
# about 20 minutes, and a machine whose CPU or compiler differs compiles its own. Delete the folder to rebuild.
LLAMA_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/autotune/llama.cpp
LLAMA_BUILT  = $(LLAMA_CACHE)/$(LLAMA_CPP_PYTHON)-$(shell { grep -m1 '^flags' /proc/cpuinfo; c++ --version 2>&1 | head -1; \
	cmake --version 2>&1 | head -1; echo '$(LLAMA_PY_ARGS) | $(LLAMA_TOOL_ARGS) | $(LLAMA_TOOLS)'; } | md5sum | cut -c1-16)
# optimum-intel, which exports a language model to OpenVINO IR, pins transformers below the main runtime's:
# it and the packages it pins go into an overlay of their own (autotune runs the export with it first on the path)
OPTIMUM_SHARE    := $(VENV)/share/optimum-intel
OPTIMUM_PACKAGES := optimum-intel==2.2.0 optimum==2.3.0 transformers==5.5.4 tokenizers==0.22.2 huggingface_hub==1.21.0 \
	httpx==0.28.1 httpcore==1.0.9 certifi==2026.10.19.post1 requests==2.34.2 charset_normalizer==3.5.3 urllib3==2.8.0
# guidellm, an independent load generator, for docs/benchmarks/guidellm_check.py only: an overlay (340 MB) of it
# and what it needs beyond the main runtime (whose torch, transformers and numpy it uses); a search needs none of it
GUIDELLM_SHARE    := $(VENV)/share/guidellm
GUIDELLM_PACKAGES := guidellm==0.8.1 aiologic==0.17.1 anyio==4.16.0 click==8.4.2 culsans==0.10.0 datasets==5.2.0 \
	dill==0.4.1 eval_type_backport==0.4.0 faker==40.63.0 ftfy==6.3.1 h11==0.16.0 h2==4.4.1 hpack==4.2.0 \
	httpcore==1.0.9 httpx==0.28.1 hyperframe==6.1.0 loguru==0.7.3 more_itertools==11.2.1 msgpack==1.2.4 \
	multiprocess==0.70.19 pandas==3.1.1 pyarrow==26.0.1 pydantic_settings==2.16.3 python_dateutil==4.0.0 \
	python_dotenv==1.2.4 pytz==2026.6 six==1.17.0 sniffio==1.3.1 tzdata==2026.6 uvloop==0.23.0 wcwidth==0.9.4 \
	websockets==17.4 wrapt==2.5.2 xxhash==4.1.0

MODEL  ?= resnet50
BUDGET ?= 20m
ARGS   ?=

.PHONY: setup system-packages test-system-packages search test test-all lint docs docs-serve clean-venv llama-cpp llama-tools optimum-intel guidellm

setup: $(STAMP) $(IPEX_STAMP) optimum-intel

$(STAMP): pyproject.toml constraints.txt
	@$(MAKE) --no-print-directory system-packages
	$(call need_disk,$(VENV_GB),the main runtime ($(VENV)),$(VENV))
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	@$(MAKE) --no-print-directory llama-cpp
	$(BIN)/pip install --quiet -c constraints.txt -e '.[test,llm,docs]'
	@touch $(STAMP)

# llama.cpp for text generation: PyPI has only the source of llama-cpp-python, which carries llama.cpp itself;
# pip compiles it into a wheel for this CPU (-march=native; about 9 minutes on 2 cores), kept in $(LLAMA_CACHE),
# and the source (300 MB) goes. Its converter (convert_hf_to_gguf.py with its conversion/ and gguf-py/) is kept
# with the wheel and goes beside it in $(LLAMA_SHARE), where autotune looks for it.
llama-cpp:
	@if $(BIN)/python -c "import llama_cpp, sys; sys.exit(llama_cpp.__version__ != '$(LLAMA_CPP_PYTHON)')" 2>/dev/null \
		&& [ -f $(LLAMA_SHARE)/convert_hf_to_gguf.py ]; then exit 0; fi; \
	set -e; built=$(LLAMA_BUILT); \
	if ! [ -f $$built/converter/convert_hf_to_gguf.py ] || ! ls $$built/wheel/llama_cpp_python-*.whl >/dev/null 2>&1; then \
		rm -rf $(LLAMA_SRC) $$built.part; mkdir -p $(LLAMA_SRC) $$built.part/wheel $$built.part/converter; \
		$(BIN)/pip download --quiet --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(LLAMA_SRC); \
		tar -xzf $(LLAMA_SRC)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_SRC); \
		echo "building llama-cpp-python $(LLAMA_CPP_PYTHON) (llama.cpp from source, -march=native), kept in $$built"; \
		CMAKE_ARGS="$(LLAMA_PY_ARGS)" $(BIN)/pip wheel --quiet --no-deps -w $$built.part/wheel \
			$(LLAMA_SRC)/llama_cpp_python-$(LLAMA_CPP_PYTHON); \
		cp -r $(LLAMA_VENDOR)/convert_hf_to_gguf.py $(LLAMA_VENDOR)/conversion $(LLAMA_VENDOR)/gguf-py $$built.part/converter/; \
		mkdir -p $$built; rm -rf $$built/wheel $$built/converter; mv $$built.part/wheel $$built.part/converter $$built/; \
		rm -rf $$built.part $(LLAMA_SRC); \
	fi; \
	$(BIN)/pip install --quiet -c constraints.txt $$built/wheel/llama_cpp_python-*.whl; \
	mkdir -p $(LLAMA_SHARE); rm -rf $(LLAMA_SHARE)/convert_hf_to_gguf.py $(LLAMA_SHARE)/conversion $(LLAMA_SHARE)/gguf-py; \
	cp -r $$built/converter/. $(LLAMA_SHARE)/

# optimum-intel's overlay (130 MB, no second torch: the export runs on the main runtime's torch, openvino, nncf)
optimum-intel: $(STAMP)
	@if [ "$$(cat $(OPTIMUM_SHARE)/VERSION 2>/dev/null)" = "$(OPTIMUM_PACKAGES)" ]; then exit 0; fi; \
	set -e; rm -rf $(OPTIMUM_SHARE); \
	$(BIN)/pip install --quiet --no-deps --target $(OPTIMUM_SHARE) $(OPTIMUM_PACKAGES); \
	PYTHONPATH=$(OPTIMUM_SHARE) $(BIN)/python -c "import optimum.exporters.openvino, optimum.commands.optimum_cli"; \
	echo "$(OPTIMUM_PACKAGES)" > $(OPTIMUM_SHARE)/VERSION

guidellm: $(STAMP)
	@if [ "$$(cat $(GUIDELLM_SHARE)/VERSION 2>/dev/null)" = "$(GUIDELLM_PACKAGES)" ]; then exit 0; fi; \
	set -e; rm -rf $(GUIDELLM_SHARE); \
	$(BIN)/pip install --quiet --no-deps --target $(GUIDELLM_SHARE) $(GUIDELLM_PACKAGES); \
	PYTHONPATH=$(GUIDELLM_SHARE) $(BIN)/python -c "import guidellm.benchmark.entrypoints"; \
	echo "$(GUIDELLM_PACKAGES)" > $(GUIDELLM_SHARE)/VERSION

# llama.cpp's own tools from the same source (its web UI off: it would be downloaded at build time):
# llama-bench and llama-batched-bench for the benchmarks that compare autotune with them
# (docs/benchmarks/llm_engines.py), llama-perplexity for the quality check of the same GGUFs, and llama-server,
# which `autotune export --format llama-server` starts a winner with. make test and make test-all build them once
# (about 10 minutes on 2 cores); a search needs none of them.
llama-tools: $(STAMP)
	@if [ "$$(cat $(LLAMA_SHARE)/bin/VERSION 2>/dev/null)" = "$(LLAMA_CPP_PYTHON) $(LLAMA_TOOLS)" ]; then exit 0; fi; \
	set -e; built=$(LLAMA_BUILT); \
	if [ "$$(cat $$built/bin/VERSION 2>/dev/null)" != "$(LLAMA_CPP_PYTHON) $(LLAMA_TOOLS)" ]; then \
		[ -d $(LLAMA_VENDOR) ] || { rm -rf $(LLAMA_SRC); mkdir -p $(LLAMA_SRC); \
			$(BIN)/pip download --quiet --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(LLAMA_SRC); \
			tar -xzf $(LLAMA_SRC)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_SRC); }; \
		echo "building llama.cpp's tools ($(LLAMA_TOOLS)), kept in $$built"; \
		cmake -S $(LLAMA_VENDOR) -B $(LLAMA_SRC)/build $(LLAMA_TOOL_ARGS); \
		cmake --build $(LLAMA_SRC)/build -j$$(nproc) --target $(LLAMA_TOOLS); \
		rm -rf $$built.part-bin; mkdir -p $$built.part-bin $$built; \
		for t in $(LLAMA_TOOLS); do cp $(LLAMA_SRC)/build/bin/$$t $$built.part-bin/; done; \
		echo "$(LLAMA_CPP_PYTHON) $(LLAMA_TOOLS)" > $$built.part-bin/VERSION; \
		rm -rf $$built/bin; mv $$built.part-bin $$built/bin; rm -rf $(LLAMA_SRC); \
	fi; \
	mkdir -p $(LLAMA_SHARE)/bin; for t in $(LLAMA_TOOLS); do cp $$built/bin/$$t $(LLAMA_SHARE)/bin/; done; \
	cp $$built/bin/VERSION $(LLAMA_SHARE)/bin/VERSION

$(IPEX_STAMP): constraints-ipex.txt pyproject.toml
	$(call need_disk,$(VENV_GB),the IPEX runtime ($(IPEX_VENV)),$(IPEX_VENV))
	$(PYTHON) -m venv $(IPEX_VENV)
	$(IPEX_VENV)/bin/pip install --quiet --upgrade pip
	$(IPEX_VENV)/bin/pip install --quiet -r constraints-ipex.txt
	$(IPEX_VENV)/bin/pip install --quiet --no-deps -e .
	@touch $(IPEX_STAMP)

# Debian packages: installed when running as root, otherwise reported with the command that installs them.
define apt_install
	@missing=$$(for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian packages: $$missing"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) >/dev/null; \
	else \
		echo "warning: missing Debian packages ($$missing); run 'sudo apt-get install $$missing' ($(2))"; \
	fi
endef

system-packages:
	$(call apt_install,$(APT_PACKAGES),to search those allocators)

test-system-packages:
	$(call apt_install,$(TEST_APT_PACKAGES),the tests that need them fail without)

search: setup
	$(BIN)/autotune search --model $(MODEL) --budget $(BUDGET) $(ARGS)

# The tiers come from the fixtures a test uses (tests/conftest.py): `make test` leaves out the end-to-end
# searches (marked slow) but for a few smoke tests; `make test-all`, which CI runs, takes everything.
test: setup test-system-packages llama-tools
	$(BIN)/python -m pytest -q --durations=20 -m "not slow" $(ARGS)

test-all: setup test-system-packages llama-tools
	$(BIN)/python -m pytest -q --durations=40 $(ARGS)

# Format, lint and type checks (configured in pyproject.toml); CI runs them before the tests.
lint: setup
	$(BIN)/ruff format --check autotune tests docs
	$(BIN)/ruff check autotune tests docs
	$(BIN)/mypy

# the manual (docs/manual) as a site, --strict: a broken link, anchor or missing page fails
docs: $(STAMP)
	$(BIN)/mkdocs build --strict --quiet -f docs/mkdocs.yml
	@echo "built studies/site/index.html"

docs-serve: $(STAMP)
	$(BIN)/mkdocs serve --strict -f docs/mkdocs.yml -a 127.0.0.1:8000

clean-venv:
	rm -rf $(VENV) $(IPEX_VENV)
