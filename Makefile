# fogdeploy — `make help` lists the targets.

GO        ?= go
# Ceph release of the librados/librbd headers go-ceph builds against (Ceph 16 = pacific).
CEPH_TAGS ?= pacific
TAGS      := -tags=$(CEPH_TAGS)
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -X github.com/fogdeploy/fogdeploy/internal/version.Version=$(VERSION)
PKGS      := ./...
APPS      ?=
DMTCP_PREFIX ?= /opt/dmtcp
export PATH := /usr/local/go/bin:$(PATH)

.DEFAULT_GOAL := help
.PHONY: help build test unit integration bench lint docs dev-up dev-down demo demo-down dmtcp-image boot-image deps engines fixtures

help: ## Show this help
	@awk 'BEGIN{FS=":.*## "} /^[a-z-]+:.*## /{printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

deps: ## Install the Debian packages the project needs, and build the checkpoint engines when their sources are available (root)
	@bash scripts/install-deps.sh
	@FOGDEPLOY_ENGINES_OPTIONAL=1 bash scripts/install-engines.sh

engines: ## Build DMTCP and CRIU into /opt/dmtcp and /opt/criu (sources: FOGDEPLOY_DMTCP_SRC, FOGDEPLOY_CRIU_SRC, FOGDEPLOY_ENGINES_DIR, or upstream)
	@bash scripts/install-engines.sh

fixtures: ## What the engine tests run apps in: redis on the host and a bookworm root file system with redis (root)
	@bash scripts/test-fixtures.sh

build: ## Build bin/fogctl and bin/pop-agent
	$(GO) build $(TAGS) -ldflags "$(LDFLAGS)" -o bin/fogctl ./fogctl
	$(GO) build $(TAGS) -ldflags "$(LDFLAGS)" -o bin/pop-agent ./pop-agent

# One package's tests at a time (-p 1): they share the dev cluster, and librados 16.2.15 can
# abort a process whose librbd calls run while another process changes a pool or the OSD map
# (a pool created or removed, a quota set, an OSD stopped); see docs/testing.md.
test: dev-up fixtures ## Run every test: unit, fake-backed and real (dev Ceph, dockerd, etcd, DMTCP and CRIU when installed)
	$(GO) test $(TAGS) -p 1 -count=1 -timeout 45m $(GOTESTFLAGS) $(PKGS)

unit: ## Run the tests that need no service (skips the rest, with reasons)
	FOGDEPLOY_CEPH_CONF=/nonexistent DOCKER_HOST=unix:///nonexistent $(GO) test $(TAGS) -count=1 $(PKGS)

bench: dev-up ## The evaluation over configs/apps (APPS=redis,nginx for a subset) into bench/results/<time>/
	@APPS="$(APPS)" GO="$(GO)" CEPH_TAGS="$(CEPH_TAGS)" bash scripts/bench.sh

docs: ## Regenerate docs/cli (fogctl's reference) from the commands; TestCLIReference fails when it is stale
	FOGDEPLOY_UPDATE_DOCS=1 $(GO) test $(TAGS) -count=1 -run TestCLIReference ./fogctl/cli/

lint: ## gofmt, go vet and staticcheck
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet $(TAGS) $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.7.0 $(TAGS) $(PKGS)

dev-up: ## Install missing packages and engines, build, start the dev Ceph cluster, dockerd and etcd (idempotent)
	@bash scripts/install-deps.sh
	@FOGDEPLOY_ENGINES_OPTIONAL=1 bash scripts/install-engines.sh
	@$(MAKE) --no-print-directory build
	@bash scripts/dev-ceph.sh up
	@bash scripts/dev-docker.sh up
	@bash scripts/dev-etcd.sh up

dev-down: ## Stop them and remove everything they left
	@bash scripts/dev-agents.sh down
	@bash scripts/dev-etcd.sh down
	@bash scripts/dev-docker.sh down
	@bash scripts/dev-ceph.sh down

demo: dev-up build ## Build a redis environment, deploy it on a 3-node PoP (plain boot, boot+checkpoint, restore), print the table
	@bash scripts/demo.sh

demo-down: ## Remove what the demo made, and stop the dev services
	@bash scripts/demo.sh down
	@$(MAKE) --no-print-directory dev-down

dmtcp-image: ## Build the light DMTCP container image from an installed DMTCP (DMTCP_PREFIX)
	@bash dmtcp-image/build.sh "$(DMTCP_PREFIX)"

boot-image: ## Build the boot image (the entrypoint without DMTCP) that runs apps without a checkpoint engine
	@bash dmtcp-image/build.sh -b

# --- An operator's install (docs/operators.md) -----------------------------------------------
# make install [PREFIX=/usr/local] [DESTDIR=] [SYSCONFDIR=/etc] [UNITDIR=/etc/systemd/system]
# The state directory is fixed: the units (StateDirectory=, --data-dir) and the example config
# name it.
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR    ?= /etc/systemd/system
CONFDIR    := $(SYSCONFDIR)/fogdeploy
STATEDIR   := /var/lib/fogdeploy
UNITS      := fogdeploy-agent.service fogdeploy-etcd.service
# The installed copies name BINDIR and CONFDIR (the sources say /usr/local/bin and /etc/fogdeploy).
INSTALL_SED := sed -e 's|/usr/local/bin/|$(BINDIR)/|g' -e 's|/etc/fogdeploy/|$(CONFDIR)/|g'
# systemctl daemon-reload only on the machine itself, and only when systemd runs it.
SYSTEMD_LIVE = [ -z "$(DESTDIR)" ] && [ -d /run/systemd/system ]
.PHONY: install uninstall

install: build ## Install fogctl, pop-agent and the systemd units; an example config only if none (PREFIX, DESTDIR; root)
	install -d -m 0755 "$(DESTDIR)$(BINDIR)" "$(DESTDIR)$(UNITDIR)"
	install -m 0755 bin/fogctl bin/pop-agent "$(DESTDIR)$(BINDIR)/"
	@mkdir -p bin/install
	@for u in $(UNITS); do \
		$(INSTALL_SED) "configs/systemd/$$u" >"bin/install/$$u" && \
		echo "install -m 0644 configs/systemd/$$u $(DESTDIR)$(UNITDIR)/$$u" && \
		install -m 0644 "bin/install/$$u" "$(DESTDIR)$(UNITDIR)/$$u" || exit 1; \
	done
	install -d -m 0750 "$(DESTDIR)$(CONFDIR)"
	@for f in pop-agent.yaml:configs/pop-agent.example.yaml pop-agent.env:configs/systemd/pop-agent.env; do \
		dst="$(DESTDIR)$(CONFDIR)/$${f%%:*}"; src="$${f#*:}"; \
		if [ -e "$$dst" ]; then echo "install: keeping $$dst (the example: $$src)"; continue; fi; \
		$(INSTALL_SED) "$$src" >"bin/install/$${f%%:*}" && \
		echo "install -m 0640 $$src $$dst" && \
		install -m 0640 "bin/install/$${f%%:*}" "$$dst" || exit 1; \
	done
	install -d -m 0700 "$(DESTDIR)$(STATEDIR)"
	@if $(SYSTEMD_LIVE); then echo "systemctl daemon-reload" && systemctl daemon-reload; \
	else echo "install: systemctl daemon-reload skipped (DESTDIR set, or systemd is not running)"; fi
	@echo "install: done; edit $(CONFDIR)/pop-agent.yaml and pop-agent.env, then: systemctl enable --now fogdeploy-agent (docs/operators.md)"

uninstall: ## Remove what make install put, except the config in SYSCONFDIR/fogdeploy and the state in /var/lib/fogdeploy
	@if $(SYSTEMD_LIVE); then for u in $(UNITS); do \
		if systemctl is-enabled --quiet "$$u" 2>/dev/null || systemctl is-active --quiet "$$u" 2>/dev/null; then \
			echo "uninstall: warning: $$u is enabled or running: systemctl disable --now $$u"; fi; \
	done; fi
	rm -f "$(DESTDIR)$(BINDIR)/fogctl" "$(DESTDIR)$(BINDIR)/pop-agent"
	rm -f $(foreach u,$(UNITS),"$(DESTDIR)$(UNITDIR)/$(u)")
	@if $(SYSTEMD_LIVE); then echo "systemctl daemon-reload" && systemctl daemon-reload; \
	else echo "uninstall: systemctl daemon-reload skipped (DESTDIR set, or systemd is not running)"; fi
	@echo "uninstall: kept $(CONFDIR) and $(STATEDIR)"
