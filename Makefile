# moonshine — build, test, fuzz.
#   make            build/moonshine
#   make check      install missing Debian packages, build, unit tests, fixture
#                   checks, unit tests under ASan+UBSan, bounded fuzzing
#   make test       unit tests + fixture checks (no installs, no sanitizers)
#   make asan       unit tests under ASan+UBSan
#   make fuzz       every fuzz target, fixed seed, FUZZ_RUNS inputs (at most FUZZ_SECONDS)
#   make gpu        GPU backend tests and bench (needs nvcc or hipcc; never part of make/check)
#   make gpu-test   build and run them on the machine's GPU 0

CC       ?= gcc
CLANG    ?= clang
OPT      ?= -O2
CFLAGS   ?= $(OPT) -g -D_FORTIFY_SOURCE=2
CFLAGS   += -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -Wno-sign-compare \
            -Wshadow=local -pthread -Isrc -MMD -MP
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

build/moonshine: $(OBJ_CLI) build/libmoonshine.a
	$(CC) $(CFLAGS) -o $@ $(OBJ_CLI) build/libmoonshine.a $(LDLIBS)

# moonshine-server is the same program; main() dispatches on its name to `serve`
build/moonshine-server: build/moonshine
	ln -f $< $@

# moonshine-chat likewise runs `chat`
build/moonshine-chat: build/moonshine
	ln -f $< $@

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
FUZZ_CFLAGS := -std=gnu11 -D_GNU_SOURCE -O1 -g -Isrc -pthread -fsanitize=fuzzer-no-link,address,undefined \
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
check: deps
	$(MAKE) -j$(JOBS) all $(TESTS) build/asan/moonshine $(ASAN_TESTS) $(FUZZERS)
	$(MAKE) test
	$(MAKE) asan
	$(MAKE) fuzz
	@echo "make check: all stages passed"

# quick start: a tiny DeepSeek-V3-shaped model (YaRN, group-limited routing,
# FP8 experts) synthesized from an embedded config, then greedy generation.
demo: deps
	$(MAKE) all
	build/moonshine synth --config tools/configs/tiny_deepseek_v3.json --out build/demo-model --expert-dtype fp8 --seed 1
	build/moonshine run build/demo-model --prompt-ids 0,17,42,7 --max-new-tokens 16 --json

clean:
	rm -rf build

# --- GPU backend (src/backend/gpu, tests/gpu): only through `make gpu` ---
# CUDA: nvcc, GPU_ARCH (default sm_90, Hopper). ROCm: hipcc when nvcc is absent
# (or GPUCC=hipcc), HIP_ARCH (default gfx90a); the sources are the same.
GPU_ARCH ?= sm_90
HIP_ARCH ?= gfx90a
GPUCC    ?= $(shell command -v nvcc 2>/dev/null || command -v hipcc 2>/dev/null)
ifneq ($(findstring hipcc,$(notdir $(GPUCC))),)
GPU_FLAGS := -x hip -DMS_GPU_HIP --offload-arch=$(HIP_ARCH) -std=c++17 -O3 -Isrc -Wall
GPU_LDFLAGS := --offload-arch=$(HIP_ARCH)
else
GPU_FLAGS := -O3 -std=c++17 -arch=$(GPU_ARCH) -lineinfo -Isrc -Xcompiler -Wall
GPU_LDFLAGS := -arch=$(GPU_ARCH)
endif
GPU_SRC  := $(sort $(wildcard src/backend/gpu/*.cu))
GPU_OBJ  := $(GPU_SRC:%.cu=build/gpu/obj/%.o)
GPU_LIBS := $(filter-out -pthread,$(LDLIBS)) -lpthread

.PHONY: gpu gpu-test
gpu:
	@if [ -z "$(GPUCC)" ]; then echo "make gpu: neither nvcc (CUDA) nor hipcc (ROCm) is on PATH; the GPU backend needs one (or set GPUCC=/path/to/nvcc)" >&2; exit 1; fi
	$(MAKE) build/gpu/test_gpu build/gpu/gpubench build/gpu/moonshine

gpu-test: gpu
	build/gpu/test_gpu

$(GPU_OBJ): $(wildcard src/backend/gpu/*.h) src/ops/ops.h src/util/dtype.h src/util/err.h
build/gpu/obj/%.o: %.cu
	@mkdir -p $(@D)
	$(GPUCC) $(GPU_FLAGS) -c -o $@ $<

build/gpu/%.o: tests/gpu/%.c
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -Itests/unit -Itests/gpu -c -o $@ $<

build/gpu/test_gpu: build/gpu/test_gpu.o $(GPU_OBJ) build/libmoonshine.a
	$(GPUCC) $(GPU_LDFLAGS) -o $@ $^ $(GPU_LIBS)

build/gpu/gpubench: build/gpu/gpubench.o $(GPU_OBJ) build/libmoonshine.a
	$(GPUCC) $(GPU_LDFLAGS) -o $@ $^ $(GPU_LIBS)

# moonshine with --gpu (the CLI's objects with another main)
build/gpu/moonshine: build/gpu/moonshine_gpu.o $(filter-out build/obj/src/cli/main.o,$(OBJ_CLI)) $(GPU_OBJ) build/libmoonshine.a
	$(GPUCC) $(GPU_LDFLAGS) -o $@ $^ $(GPU_LIBS)

-include $(shell find build -name '*.d' 2>/dev/null)
