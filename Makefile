# Two commands do everything on a fresh Debian/Ubuntu machine with Docker:
#   make demo   venv, install, engine, images, then the triage example and its report
#   make test   the same set-up, then ruff, mypy (strict) and the whole test suite (in
#               parallel, then its `serial` tests alone), and its core integration tests
#               against Podman too
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Harbor's own venv (Python 3.12 or newer, found by the script): `harbor run` for the
# Harbor environment's tests (docs/harbor.md); the pin is scripts/harbor-requirements.txt.
HARBOR_VENV  := .venv-harbor
HARBOR_STAMP := $(HARBOR_VENV)/.installed

.PHONY: demo test test-podman lint images images-orchestrator engine bench clean harbor-venv browser

$(STAMP): pyproject.toml
	scripts/ensure-engine.sh
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

# The engine, with the gVisor runtimes untrusted workers run under, and the host firewall
# rule that keeps allowlisted workers away from the host's services, with its exception
# for Podman's DNS (docs/network.md, Limits; added once, never twice). Needs root: sudo.
engine: $(STAMP)
	scripts/ensure-engine.sh --gvisor $(BIN)/python

images: $(STAMP) engine
	$(BIN)/orchestrator images build

# The images above plus orchestrator/orchestrator, for compose/ and CI runners (docs/ci.md).
images-orchestrator: $(STAMP) engine
	$(BIN)/orchestrator images build --with-orchestrator

$(HARBOR_STAMP): pyproject.toml scripts/harbor-requirements.txt scripts/harbor-venv.sh
	scripts/harbor-venv.sh $(HARBOR_VENV)

harbor-venv: $(HARBOR_STAMP)

# Debian's chromium and chromedriver, for the review console's browser tests.
browser:
	scripts/ensure-browser.sh

lint: $(STAMP)
	$(BIN)/ruff check orchestrator tests bench examples
	$(BIN)/ruff format --check orchestrator tests bench examples
	$(BIN)/mypy

# The core integration tests that also run against Podman (a rootful `podman system
# service` the session starts and removes; docs/engines.md): runs, exit codes, outbox,
# hardening, masks, limits, execs and sessions, the warm pool, allowlisted egress (also
# with the host firewall rule, which the session applies before its first test), gc.
PODMAN_TESTS := \
	tests/integration/test_podman.py \
	tests/integration/test_engine_contract.py \
	tests/integration/test_backend_contract.py::test_the_fake_engine_runs_the_lifecycle_as_the_real_one_does \
	tests/integration/test_lifecycle.py::test_exit_code_and_output_propagate \
	tests/integration/test_lifecycle.py::test_command_not_found_is_127 \
	tests/integration/test_lifecycle.py::test_timeout_exits_124_and_leaves_nothing \
	tests/integration/test_lifecycle.py::test_signal_to_the_orchestrator_removes_the_container \
	tests/integration/test_lifecycle.py::test_sigkilled_orchestrator_leaves_only_what_gc_removes \
	tests/integration/test_outbox.py::test_outbox_has_a_hard_cap_seen_as_no_space_inside \
	tests/integration/test_outbox.py::test_stragglers_are_killed_before_the_outbox_is_read \
	tests/integration/test_outbox.py::test_oom_with_an_outbox_is_137 \
	tests/integration/test_outbox.py::test_missing_command_with_an_outbox_is_127 \
	tests/integration/test_isolation.py::test_memory_bomb_is_killed_as_oom \
	tests/integration/test_kernel_log.py \
	tests/integration/test_hardening.py::test_io_uring_is_refused_and_ulimits_apply_at_every_trust_level \
	tests/integration/test_zones.py::test_repo_never_exposes_the_sandbox_and_git_stays_read_only \
	tests/integration/test_isolation.py::test_tmp_is_size_capped \
	tests/integration/test_isolation.py::test_fork_bomb_is_contained_by_the_pid_limit \
	tests/integration/test_execs.py \
	tests/integration/test_session.py::test_exec_results_env_and_streaming \
	tests/integration/test_session.py::test_writes_reach_the_container_and_back \
	tests/integration/test_pool.py::test_a_pooled_run_works_like_a_cold_one_and_stages_its_outbox \
	tests/integration/test_egress.py::test_allowlisted_host_is_reachable_and_everything_else_is_refused \
	tests/integration/test_egress.py::test_a_child_through_the_broker_gets_its_own_network \
	tests/integration/test_egress.py::test_with_the_host_rule_the_way_out_works_and_no_host_service_is_reached

# The whole suite in two phases: every test not marked `serial` on $(TEST_WORKERS) processes
# (pytest-xdist; each integration file stays on one process, tests/conftest.py), then the
# `serial` ones alone (they need the engine to themselves: gc of dead owners' objects,
# swarm mode, the host firewall, the kernel log). Each phase ends with the leak check.
TEST_WORKERS ?= 2

test: images lint harbor-venv browser
	TESTCONTAINERS_RYUK_DISABLED=true $(BIN)/pytest -n $(TEST_WORKERS) -m 'not serial'
	TESTCONTAINERS_RYUK_DISABLED=true $(BIN)/pytest -m serial
	TESTCONTAINERS_RYUK_DISABLED=true $(BIN)/pytest --engine=podman $(PODMAN_TESTS)

# Only the Podman subset (needs root for the rootful service and the rootless test user).
test-podman: $(STAMP) engine
	TESTCONTAINERS_RYUK_DISABLED=true $(BIN)/pytest --engine=podman $(PODMAN_TESTS)

demo: images
	rm -rf examples/triage/output
	$(BIN)/orchestrator run triage --project examples/triage
	@echo
	@cat examples/triage/output/report.md

bench: images
	$(BIN)/python bench/run_bench.py

clean:
	rm -rf $(VENV) $(HARBOR_VENV) examples/triage/output .pytest_cache .mypy_cache .ruff_cache
