# sparkfold: the two commands a new user needs, plus the pieces they are made of.
#   make demo   build everything needed and serve the demo model (see README)
#   make test       lint and the lean suite: every test not marked slow/netns/testbed/fleet/gpu (minutes)
#   make test-ci    what CI runs (.ci/run): the pair testbed in the background while lint, the unit,
#                   ansible, integration and agents tests not marked slow run, each phase timed
#                   (docs/testing.md has the budget)
#   make test-all   lint and every test but the fleet testbed and the GPU ones, slow ones included
#   make test-fleet the fleet testbed (tests marked fleet); in neither CI's run nor test-all
#   make test-agents the agent CLIs (tests/agents, pinned by npm) against the gateway; part of test-ci
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
STAMP := $(VENV)/.installed

.PHONY: venv lock lock-check test test-ci test-all lanes test-fleet test-agents agent-clis lint unit testbed-tools demo demo-down demo-fleet demo-fleet-down clean gpu-run

venv: $(STAMP)

# The venv installs from the lock (requirements/README.md): every package pinned and hashed, the one
# for this Python and CPU (torch's CPU build among them), then sparkfold itself without dependencies.
# uv installs it (minutes faster than pip: parallel downloads and unpacking); uv itself comes first,
# by pip, pinned and hashed by the same lock; uv is told where pip's configuration finds packages.
# The lock's name and digest are recorded in the venv (sparkfold doctor shows them).
LOCK := requirements/dev-py$(shell python3 -c 'import sys; print("%d%d" % sys.version_info[:2])')-$(shell uname -m).txt
UV_INSTALL = $(VENV)/bin/uv pip install -q --python $(PY) $$($(PY) requirements/lock.py uv-sources)
$(STAMP): pyproject.toml $(LOCK) requirements/nodeps.txt
	@test -f $(LOCK) || { echo "no lock for this Python and CPU: $(LOCK) (requirements/README.md lists those there are)" >&2; exit 1; }
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --require-hashes --no-deps -r <(python3 requirements/lock.py entry uv $(LOCK))
	$(UV_INSTALL) --upgrade pip
	$(UV_INSTALL) --require-hashes -r $(LOCK)
	$(UV_INSTALL) --require-hashes --no-deps -r requirements/nodeps.txt
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps --no-build-isolation -e .
	$(PY) -m sparkfold.lockfile record $(LOCK) $(VENV)
	touch $(STAMP)

# Regenerate requirements/ from pyproject.toml (uv, PyPI); lock-check (in lint) says when it is due.
lock: venv
	PATH=$(VENV)/bin:$$PATH $(PY) requirements/lock.py compile

lock-check:
	python3 requirements/lock.py check

lint: venv lock-check
	$(VENV)/bin/ruff check runtime tests roles requirements
	$(VENV)/bin/ruff format --check runtime tests roles requirements
	$(VENV)/bin/mypy runtime roles/sparkfold_runtime/files/platform_probe.py

# Each pytest runs under .ci/phase: timed, and its exit 5 (nothing collected) counts as passed.
PYTEST := $(VENV)/bin/pytest
PHASE := .ci/phase
LEAN := not slow and not netns and not testbed and not fleet and not gpu and not agents

test: lint
	$(PHASE) lean $(PYTEST) tests -m "$(LEAN)"

# test-ci and test-all run two lanes at once (docs/testing.md: the CI budget). The pair testbed,
# the longest phase, starts first, in the background; its output goes to $(TESTBED_LOG) and is
# printed whole when it ends. Meanwhile the other phases run one after another (`lanes`, stopping at
# the first that fails) at a lower CPU priority (LANES_NICE): they have time to spare, the testbed
# has none, so they take the cores it leaves idle rather than slowing it down. Both lanes end before
# make does; it fails if either failed.
# $(1): the marker expression for unit, ansible, integration and agents.
TESTBED_LOG := .cache/testbed-phase.log
LANES_NICE := 10
define test_lanes
	@mkdir -p $(dir $(TESTBED_LOG))
	@echo "testbed: in the background, its output in $(TESTBED_LOG) (printed when it ends)"
	@$(PHASE) testbed $(PYTEST) tests/testbed -m "not fleet" >$(TESTBED_LOG) 2>&1 & testbed=$$!; \
	nice -n $(LANES_NICE) $(MAKE) --no-print-directory lanes MARKERS="$(1)"; rc=$$?; \
	wait $$testbed; testbed_rc=$$?; \
	cat $(TESTBED_LOG); \
	exit $$(( rc ? rc : testbed_rc ))
endef

test-ci: venv
	$(call test_lanes,not slow and not fleet)

test-all: venv
	$(call test_lanes,not fleet)

# The foreground lane of test-ci and test-all; MARKERS: their marker expression.
lanes: venv
	$(PHASE) lint $(MAKE) --no-print-directory lint
	$(PHASE) unit $(PYTEST) tests/unit -m "$(MARKERS)"
	$(PHASE) ansible $(PYTEST) tests/ansible -m "$(MARKERS)"
	$(PHASE) integration $(PYTEST) tests/integration -m "$(MARKERS)"
	$(PHASE) agent-clis $(MAKE) --no-print-directory agent-clis
	$(PHASE) agents $(PYTEST) tests/agents -m "$(MARKERS)"

test-fleet: venv
	$(PHASE) fleet $(PYTEST) tests -m fleet

# The agent CLIs tests/agents drives (docs/agents.md), exactly as its package-lock.json pins them.
AGENTS := tests/agents
agent-clis: $(AGENTS)/node_modules/.installed
$(AGENTS)/node_modules/.installed: $(AGENTS)/package-lock.json
	cd $(AGENTS) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

test-agents: venv agent-clis
	$(PHASE) agents $(PYTEST) tests/agents -m "not slow"

unit: venv
	$(PHASE) unit $(PYTEST) tests/unit

# The two-node testbed (root; debootstrap + systemd-nspawn), provisioned by the same site.yml as a
# real pair; the verify stage prints a curl line that works as pasted.
# ENGINE=transformers (default): the CPU engine and the demo model, one rank per node.
# ENGINE=tensorfold: the production engine kind, its image built on the head (the TensorFold
# stand-in) and one rank per node under Docker (inventory/testbed-tensorfold.yml). Either re-converges
# the same pair.
ENGINE ?= transformers
# First, before the venv (minutes on a fresh host): the host's tools, installed with apt as root
# (it prints the apt-get line first), or the line to run.
testbed-tools:
	@roles/sparkfold_testbed/files/need-tools.sh --install >&2
demo: testbed-tools venv
	@case "$(ENGINE)" in transformers|tensorfold) ;; *) echo "ENGINE=$(ENGINE): use ENGINE=transformers (the default) or ENGINE=tensorfold" >&2; exit 2;; esac
	$(VENV)/bin/ansible-playbook playbooks/testbed.yml
	$(VENV)/bin/ansible-playbook site.yml $(if $(filter tensorfold,$(ENGINE)),-e @inventory/testbed-tensorfold.yml)
	@echo; echo "The API, as pasted:"; cat .cache/control/testbed-curl.txt

demo-down: venv
	$(VENV)/bin/ansible-playbook playbooks/teardown.yml

# The fleet testbed (docs/fleet.md): two one-node pairs (CPU engine, tp = 1) behind the router on
# sffl-a, provisioned by the same site.yml; the router stage prints a curl line against the router.
demo-fleet: testbed-tools venv
	$(VENV)/bin/ansible-playbook -i inventory/fleet-testbed playbooks/testbed.yml
	$(VENV)/bin/ansible-playbook -i inventory/fleet-testbed site.yml
	@echo; echo "The fleet's API, as pasted:"; cat .cache/control/fleet-testbed-router-curl.txt

demo-fleet-down: venv
	$(VENV)/bin/ansible-playbook -i inventory/fleet-testbed playbooks/teardown.yml

clean:
	rm -rf $(VENV) var

# The whole GPU run on a CUDA host (docs/gpu.md): carried wheels and extension build, fixture
# conversion, tests/gpu, benchmark; logs and results in OUT (default var/gpu).
OUT ?= var/gpu
gpu-run:
	tests/gpu/run.sh $(OUT)
