# moonshine — build, test, fuzz.
#   make            build/moonshine (with the GPU backend, --backend cuda|hip, when nvcc or
#                   hipcc is found; GPU=0 for the CPU-only program)
#   make check      install missing Debian packages, build (the GPU backend and its tests
#                   with every GPU compiler found, compile and link only), unit tests,
#                   fixture checks, unit tests under ASan+UBSan, bounded fuzzing
#   make test       unit tests + fixture checks (no installs, no sanitizers)
#   make asan       unit tests under ASan+UBSan
#   make fuzz       every fuzz target, fixed seed, FUZZ_RUNS inputs (at most FUZZ_SECONDS)
#   make gpu        the GPU tests and bench of the default GPU toolchain (build/gpu-cuda or -hip)
#   make gpu-check  build them and run the GPU tests on the machine's GPU 0 (needs a GPU)

CC       ?= gcc
CLANG    ?= clang
OPT      ?= -O2
CFLAGS   ?= $(OPT) -g -D_FORTIFY_SOURCE=2
CFLAGS   += -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare \
            -Wshadow=local -pthread -Isrc -Ibuild/gen -MMD -MP
LDLIBS   := -lcjson -luring -lpcre2-8 -lcrypto -lmicrohttpd -ledit -lm -pthread
FUZZ_SECONDS ?= 60
FUZZ_RUNS ?= 100000
# targets with a known open finding (tests/fuzz/open/README.md); none now
FUZZ_OPEN ?=

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/cli/*' -not -path 'src/backend/gpu/*' | sort)
CLI_SRC  := $(shell find src/cli -name '*.c' | sort)
TEST_SRC := $(sort $(wildcard tests/unit/test_*.c))
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))

OBJ_LIB  := $(LIB_SRC:%.c=build/obj/%.o)
OBJ_CLI  := $(CLI_SRC:%.c=build/obj/%.o)
TESTS    := $(TEST_SRC:tests/unit/%.c=build/tests/%)
ASAN_LIB := $(LIB_SRC:%.c=build/asan/%.o)
ASAN_TESTS := $(TEST_SRC:tests/unit/%.c=build/asan/tests/%)
FUZZ_LIB := $(LIB_SRC:%.c=build/fuzz/%.o)
FUZZERS  := $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/bin/%)

SAN_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer

.PHONY: all check test unit fixtures server asan fuzz deps clean demo
all: build/moonshine build/moonshine-server build/moonshine-chat

build/libmoonshine.a: $(OBJ_LIB)
	@mkdir -p $(@D)
	rm -f $@ && ar rcs $@ $^

# build/moonshine: below, with the GPU backend

# moonshine-server is the same program; main() dispatches on its name to `serve`
build/moonshine-server: build/moonshine
	ln -f $< $@

# moonshine-chat likewise runs `chat`
build/moonshine-chat: build/moonshine
	ln -f $< $@

# the web chat page, embedded in the binary (GET /): a C array made by xxd -i
build/gen/chat_page.h: src/server/web/chat.html
	@mkdir -p $(@D)
	cd src/server/web && xxd -i chat.html > $(CURDIR)/$@.tmp
	mv $@.tmp $@
build/obj/src/server/web.o build/asan/src/server/web.o build/fuzz/src/server/web.o: build/gen/chat_page.h

build/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

build/tests/%: tests/unit/%.c build/libmoonshine.a tests/unit/test.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests/unit -o $@ $< build/libmoonshine.a $(LDLIBS)

# --- sanitizers (same sources, separate objects) ---
build/asan/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(SAN_FLAGS) -O1 -c -o $@ $<

build/asan/libmoonshine.a: $(ASAN_LIB)
	rm -f $@ && ar rcs $@ $^

build/asan/moonshine: $(CLI_SRC:%.c=build/asan/%.o) build/asan/libmoonshine.a
	$(CC) $(CFLAGS) $(SAN_FLAGS) -O1 -o $@ $(CLI_SRC:%.c=build/asan/%.o) build/asan/libmoonshine.a $(LDLIBS)

build/asan/tests/%: tests/unit/%.c build/asan/libmoonshine.a tests/unit/test.h
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) $(SAN_FLAGS) -O1 -Itests/unit -o $@ $< build/asan/libmoonshine.a $(LDLIBS)

# --- libFuzzer (clang) ---
FUZZ_CFLAGS := -std=gnu11 -D_GNU_SOURCE -O1 -g -Isrc -Ibuild/gen -pthread -fsanitize=fuzzer-no-link,address,undefined \
               -fno-sanitize-recover=all -MMD -MP
build/fuzz/%.o: %.c
	@mkdir -p $(@D)
	$(CLANG) $(FUZZ_CFLAGS) -c -o $@ $<

build/fuzz/libmoonshine.a: $(FUZZ_LIB)
	rm -f $@ && ar rcs $@ $^

build/fuzz/bin/%: tests/fuzz/%.c build/fuzz/libmoonshine.a
	@mkdir -p $(@D)
	$(CLANG) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< build/fuzz/libmoonshine.a $(LDLIBS)

# --- test entry points ---
unit: $(TESTS) build/moonshine
	@tests/scripts/run_unit.sh $(TESTS)

fixtures: build/moonshine
	@tests/scripts/run_fixtures.sh

# moonshine-server against the official OpenAI SDK (tests/server/run.sh)
server: all
	@tests/server/run.sh

# moonshine chat: scripted sessions over a tiny model with the real Qwen3 tokenizer (tests/chat/run.sh)
chat: all
	@tests/chat/run.sh

test: unit fixtures server chat

asan: $(ASAN_TESTS) build/asan/moonshine
	@ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 tests/scripts/run_unit.sh $(ASAN_TESTS)
	@ASAN_OPTIONS=detect_leaks=1 MOONSHINE=build/asan/moonshine tests/scripts/run_fixtures.sh
	@ASAN_OPTIONS=detect_leaks=1 MOONSHINE_SERVER="build/asan/moonshine serve" MOONSHINE_CHAT="build/asan/moonshine chat" tests/server/run.sh
	@ASAN_OPTIONS=detect_leaks=1 CHAT_TEST_QUICK=1 MOONSHINE=build/asan/moonshine tests/chat/run.sh

fuzz: $(FUZZERS)
	@FUZZ_OPEN='$(FUZZ_OPEN)' tests/scripts/run_fuzz.sh $(FUZZ_SECONDS) $(FUZZ_RUNS) $(FUZZERS)

deps:
	@tools/install-deps.sh

JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# the build stage runs in a sub-make, so that it sees compilers deps has just installed (hipcc)
check: deps
	@$(MAKE) --no-print-directory gpu-report
	$(MAKE) -j$(JOBS) check-build
	$(MAKE) test
	$(MAKE) asan
	$(MAKE) fuzz
	@$(MAKE) --no-print-directory gpu-report
	@echo "make check: all stages passed"

# quick start: chat with the trained demo model (models/demo: a 4-layer, 16-expert Qwen3-MoE with FP8
# experts, trained on WordNet by tools/demo), streamed too, then serve it and ask once with curl.
demo: deps
	$(MAKE) all
	@tools/demo/demo.sh

clean:
	rm -rf build

# --- GPU backend (src/backend/gpu, tests/gpu) ---
# The same CUDA-syntax sources build with nvcc (CUDA; GPU_ARCH, default sm_90, Hopper) and
# hipcc (ROCm; HIP_ARCH, default gfx90a), each into its own directory: build/gpu-cuda,
# build/gpu-hip. NVCC / HIPCC name the compilers (found on PATH, else in /usr/local/cuda*/bin
# or /opt/rocm/bin); an empty NVCC= / HIPCC= leaves that toolchain out.
# GPU picks what the default build/moonshine links: auto (default: cuda when nvcc is found,
# else hip when hipcc is, else none), cuda, hip, or 0 (the CPU-only program).
GPU_ARCH ?= sm_90
HIP_ARCH ?= gfx90a
NVCC     ?= $(firstword $(shell command -v nvcc 2>/dev/null) $(wildcard /usr/local/cuda/bin/nvcc) \
                        $(lastword $(sort $(wildcard /usr/local/cuda-*/bin/nvcc))))
HIPCC    ?= $(firstword $(shell command -v hipcc 2>/dev/null) $(wildcard /opt/rocm/bin/hipcc))
GPU      ?= auto
ifeq ($(GPU),auto)
GPU_KIND := $(if $(NVCC),cuda,$(if $(HIPCC),hip))
else ifeq ($(GPU),0)
GPU_KIND :=
else ifeq ($(filter cuda hip,$(GPU)),)
$(error GPU=$(GPU): use auto, cuda, hip or 0)
else
GPU_KIND := $(GPU)
endif

GPU_CC_cuda    := $(NVCC)
GPU_CC_hip     := $(HIPCC)
GPU_FLAGS_cuda := -O3 -std=c++17 -arch=$(GPU_ARCH) -lineinfo -Isrc -Xcompiler -Wall
GPU_FLAGS_hip  := -x hip -DMS_GPU_HIP --offload-arch=$(HIP_ARCH) -std=c++17 -O3 -Isrc -Wall
GPU_LD_cuda    := -arch=$(GPU_ARCH)
GPU_LD_hip     := --offload-arch=$(HIP_ARCH)
# the vendor BLAS of the prefill GEMMs (src/backend/gpu/gemm.cu): cuBLAS ships with CUDA and is
# loaded at run time (dlopen at the first GEMM: linked, its relocations cost every process ~200 MB of
# RSS); hipBLAS is linked, only where ROCm's is installed (not in Debian 12: the HIP build then
# leaves the GEMMs out)
HIPBLAS_H      := $(firstword $(wildcard /opt/rocm/include/hipblas/hipblas.h /usr/include/hipblas/hipblas.h))
GPU_BLAS_cuda  :=
GPU_BLAS_hip   := $(if $(HIPBLAS_H),-lhipblas)
GPU_FLAGS_hip  += $(if $(HIPBLAS_H),-DMS_GPU_HIPBLAS)
GPU_NAME_cuda  := nvcc (CUDA, $(GPU_ARCH))
GPU_NAME_hip   := hipcc (ROCm, $(HIP_ARCH))
GPU_SRC  := $(sort $(wildcard src/backend/gpu/*.cu))
GPU_HDR  := $(wildcard src/backend/gpu/*.h) src/ops/ops.h src/util/dtype.h src/util/err.h src/core/backend.h \
            src/backend/cpu/backend_cpu.h src/model/config.h
GPU_LIBS := $(filter-out -pthread,$(LDLIBS)) -lpthread
GPU_TESTS_OBJ := $(patsubst %.c,build/obj/%.o,$(sort $(wildcard tests/gpu/test_gpu*.c)))
GPU_BENCH_OBJ := build/obj/tests/gpu/gpubench.o
build/obj/tests/gpu/%.o: CFLAGS += -Itests/unit -Itests/gpu
# the moonshine program of one toolchain: main.c and common.c with MS_WITH_GPU (--backend cuda|hip,
# backend/gpu/backend_gpu.h) and the .cu objects
GPU_CLI_C   := build/obj/src/cli/main.o build/obj/src/cli/common.o
GPU_CLI_OBJ = $(filter-out $(GPU_CLI_C),$(OBJ_CLI)) $(GPU_CLI_C:build/obj/%=build/gpu-$(1)/obj/%) \
              $(GPU_SRC:%.cu=build/gpu-$(1)/obj/%.o) build/libmoonshine.a

# one toolchain's rules: objects, test_gpu, gpubench and moonshine (--backend $(1)) in build/gpu-$(1)
define GPU_RULES
$(GPU_SRC:%.cu=build/gpu-$(1)/obj/%.o): $(GPU_HDR)
build/gpu-$(1)/obj/%.o: %.cu
	@mkdir -p $$(@D)
	$$(GPU_CC_$(1)) $$(GPU_FLAGS_$(1)) -c -o $$@ $$<
build/gpu-$(1)/obj/%.o: %.c
	@mkdir -p $$(@D)
	$$(CC) $$(CFLAGS) -DMS_WITH_GPU -DMS_GPU_KIND='"$(1)"' -c -o $$@ $$<
build/gpu-$(1)/test_gpu: $(GPU_TESTS_OBJ) $(GPU_SRC:%.cu=build/gpu-$(1)/obj/%.o) build/libmoonshine.a
	$$(GPU_CC_$(1)) $$(GPU_LD_$(1)) -o $$@ $$^ $$(GPU_LIBS) $$(GPU_BLAS_$(1))
build/gpu-$(1)/gpubench: $(GPU_BENCH_OBJ) $(GPU_SRC:%.cu=build/gpu-$(1)/obj/%.o) build/libmoonshine.a
	$$(GPU_CC_$(1)) $$(GPU_LD_$(1)) -o $$@ $$^ $$(GPU_LIBS) $$(GPU_BLAS_$(1))
build/gpu-$(1)/moonshine: $(call GPU_CLI_OBJ,$(1))
	$$(GPU_CC_$(1)) $$(GPU_LD_$(1)) -o $$@ $$^ $$(GPU_LIBS) $$(GPU_BLAS_$(1))
endef
$(foreach k,cuda hip,$(eval $(call GPU_RULES,$(k))))

# build/moonshine: the GPU toolchain's program when there is one, else the CPU one. The mode
# file relinks it when the choice changes (e.g. `make GPU=0` after `make`).
MODE_LINE := $(if $(GPU_KIND),$(GPU_KIND) $(GPU_CC_$(GPU_KIND)) $(GPU_LD_$(GPU_KIND)),cpu)
build/moonshine.mode: FORCE
	@mkdir -p $(@D)
	@echo '$(MODE_LINE)' | cmp -s - $@ || echo '$(MODE_LINE)' > $@
.PHONY: FORCE
FORCE:
ifneq ($(GPU_KIND),)
ifeq ($(GPU_CC_$(GPU_KIND)),)
$(error GPU=$(GPU): no $(if $(filter cuda,$(GPU_KIND)),nvcc,hipcc) found (set $(if $(filter cuda,$(GPU_KIND)),NVCC,HIPCC)=/path/to/it, or GPU=0))
endif
build/moonshine: $(call GPU_CLI_OBJ,$(GPU_KIND)) build/moonshine.mode
	$(GPU_CC_$(GPU_KIND)) $(GPU_LD_$(GPU_KIND)) -o $@ $(call GPU_CLI_OBJ,$(GPU_KIND)) $(GPU_LIBS) $(GPU_BLAS_$(GPU_KIND))
else
build/moonshine: $(OBJ_CLI) build/libmoonshine.a build/moonshine.mode
	$(CC) $(CFLAGS) -o $@ $(OBJ_CLI) build/libmoonshine.a $(LDLIBS)
endif

# make check's GPU stage: compile and link with every toolchain found (nothing runs; CI has
# no GPU). A missing compiler is reported and its half skipped.
GPU_FOUND := $(if $(NVCC),cuda) $(if $(HIPCC),hip)
# (build/gpu-K/moonshine is the same program as build/moonshine for the default toolchain)
GPU_BUILD := $(foreach k,$(GPU_FOUND),build/gpu-$(k)/test_gpu build/gpu-$(k)/gpubench \
                                      $(if $(filter $(k),$(GPU_KIND)),,build/gpu-$(k)/moonshine))
# make check's build stage (after GPU_BUILD, which its prerequisites need)
.PHONY: check-build
check-build: all $(TESTS) build/asan/moonshine $(ASAN_TESTS) $(FUZZERS) $(GPU_BUILD)

.PHONY: gpu-report gpu gpu-check gpu-test
gpu-report:
	@$(if $(NVCC),echo "GPU stage: nvcc $(NVCC) -arch=$(GPU_ARCH) -> build/gpu-cuda",echo "GPU stage: no nvcc (not on PATH nor in /usr/local/cuda*/bin, or NVCC= empty): CUDA compile SKIPPED")
	@$(if $(HIPCC),echo "GPU stage: hipcc $(HIPCC) --offload-arch=$(HIP_ARCH) -> build/gpu-hip",echo "GPU stage: no hipcc (not on PATH nor in /opt/rocm/bin, or HIPCC= empty): HIP compile SKIPPED")
	@echo "build/moonshine: $(if $(GPU_KIND),with the GPU backend ($(GPU_NAME_$(GPU_KIND)); --backend $(GPU_KIND)),CPU only)"

# the GPU programs of the default toolchain
gpu:
	@if [ -z "$(GPU_KIND)" ]; then echo "make gpu: no GPU compiler (nvcc for CUDA, hipcc for ROCm) found, or GPU=0; set NVCC=/path/to/nvcc or HIPCC=/path/to/hipcc" >&2; exit 1; fi
	$(MAKE) build/gpu-$(GPU_KIND)/test_gpu build/gpu-$(GPU_KIND)/gpubench build/moonshine

# on a machine with a GPU: build and run the GPU tests (every op against its CPU twin) on GPU 0
gpu-check: gpu
	build/gpu-$(GPU_KIND)/test_gpu
gpu-test: gpu-check

-include $(shell find build -name '*.d' 2>/dev/null)
