# gwdet's entry points. Each target installs what it needs first (scripts/setup_env.sh, idempotent).
#   make demo   train + evaluate the demo Mask R-CNN (GW) on the embedded shapes dataset (CPU)
#   make test   the test suite (CPU)
#   make setup  only create/refresh the virtual environment (.venv)
VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.gwdet-installed
DEMO_CONFIG ?= configs/Demo/mask_rcnn_R_50_FPN_gw_shapes.yaml

.PHONY: setup demo test clean-demo

$(STAMP): setup.py scripts/setup_env.sh
	bash scripts/setup_env.sh $(VENV)
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(PYTHON) tools/train_net.py --config $(DEMO_CONFIG)

# pytest exits 5 when it collects no test: an empty suite checks nothing, so that fails too.
test: $(STAMP)
	$(PYTHON) -m pytest -q tests; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests" >&2; exit 1; fi; exit $$status

clean-demo:
	rm -rf output/demo
