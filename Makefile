# The two commands of the README.
#   make run    start the gateway on its embedded default (sets everything up first)
#   make test   install everything the tests need and run the whole suite
PY ?= python3
VENV ?= .venv

.PHONY: run test setup lint

setup:
	@PY=$(PY) VENV=$(VENV) scripts/bootstrap.sh

run: setup
	$(VENV)/bin/prefixgate serve $(ARGS)

test: setup
	@VENV=$(VENV) scripts/test.sh

lint: setup
	$(VENV)/bin/ruff check gateway engine policies loadtest tests
	$(VENV)/bin/lint-imports
