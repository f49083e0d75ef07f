# demo.mk - the end-to-end demo on the shipped story model (make demo).
# The training stages (bk-gen, bk-teach, bk-step) arrive with issue [3/6]; until then
# this recipe only says so.
BIN ?= build/bin
.PHONY: demo
demo:
	@echo "demo: not yet (needs bk-gen, bk-teach and bk-step, planned in [3/6])"
