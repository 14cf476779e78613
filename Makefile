# vmmshim: build, test, benchmark.
#   make            build/libvmmshim.so
#   make demo       build and run the bundled CUDA program under the shim (needs a GPU)
#   make test       CPU tests on the host emulation of the driver, then under sanitizers (CI runs this)
#   make test-sanitize  only the sanitizer pass
#   make gpu-test   GPU tests (needs a GPU and nvcc)
#   make bench      GPU benchmarks (needs a GPU and nvcc)
#   make bench-cpu  the shim's own cost per pair on the host emulation (no GPU)

CUDA_HOME ?= /usr/local/cuda
CC        ?= cc
NVCC      ?= $(CUDA_HOME)/bin/nvcc
BUILD     ?= build
PYTHON    ?= python3

WARN      := -Wall -Wextra -Werror
LIB_FLAGS := -std=c11 -D_GNU_SOURCE $(WARN) -fPIC -fno-omit-frame-pointer -fvisibility=hidden -ftls-model=initial-exec \
             -Iinclude -I$(CUDA_HOME)/include -pthread
CFLAGS    ?= -O2 -g
CFLAGS    += $(LIB_FLAGS)
LDLIBS    := -ldl -pthread

# src/pool_*.c are parts of pool.c's translation unit (it includes them): not compiled alone.
SRC       := $(filter-out src/pool_%.c,$(wildcard src/*.c))
HDR       := include/vmmshim.h $(wildcard include/vmmshim/*.h)
OBJ       := $(SRC:src/%.c=$(BUILD)/obj/%.o)
LIB       := $(BUILD)/libvmmshim.so

.PHONY: all demo test test-sanitize gpu-test bench bench-cpu clean deps
all: $(LIB)

$(BUILD)/obj/%.o: src/%.c $(HDR) | $(BUILD)/obj
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/obj/pool.o: $(wildcard src/pool_*.c)

$(LIB): $(OBJ)
	$(CC) -shared -o $@ $(OBJ) $(LDLIBS)

$(BUILD)/obj $(BUILD)/emu $(BUILD)/tests $(BUILD)/bench:
	mkdir -p $@

# ---- host emulation of the CUDA driver and runtime (tests/emu) ----
EMU_CFLAGS := -std=c11 -D_GNU_SOURCE $(WARN) -O1 -g -fPIC -Itests/emu -Iinclude -I$(CUDA_HOME)/include -pthread
EMU_DRV    := $(BUILD)/emu/libcuda.so.1
EMU_RT     := $(BUILD)/emu/libcudart.so.13
EMU_RT_A   := $(BUILD)/emu/libcudart_static.a
EMU_HDR    := $(wildcard tests/emu/*.h)

$(EMU_DRV): tests/emu/cuda_emu.c $(EMU_HDR) | $(BUILD)/emu
	$(CC) $(EMU_CFLAGS) -shared -Wl,-soname,libcuda.so.1 -o $@ $< -ldl -pthread -lrt
	ln -sf libcuda.so.1 $(BUILD)/emu/libcuda.so

$(EMU_RT): tests/emu/cudart_emu.c $(EMU_HDR) | $(BUILD)/emu
	$(CC) $(EMU_CFLAGS) -shared -Wl,-soname,libcudart.so.13 -o $@ $< -ldl -pthread
	ln -sf libcudart.so.13 $(BUILD)/emu/libcudart.so

$(EMU_RT_A): tests/emu/cudart_emu.c $(EMU_HDR) | $(BUILD)/emu
	$(CC) $(EMU_CFLAGS) -DEMU_STATIC_RUNTIME -c -o $(BUILD)/emu/cudart_static.o $<
	ar rcs $@ $(BUILD)/emu/cudart_static.o

# ---- CPU tests ----
# tests/test_shim_*.c : programs run under LD_PRELOAD=libvmmshim.so against the emulation
# tests/test_static_*.c: the same, with the emulated runtime linked statically (nvcc's default)
# tests/test_unit_*.c : shim sources linked straight in (no preload)
# tests/test_emu_*.c  : the emulation on its own (it must enforce the driver's contract)
T_SHIM    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_shim_*.c))
T_STATIC  := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_static_*.c))
T_UNIT    := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_unit_*.c))
T_EMU     := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_emu_*.c))
T_HDR     := $(wildcard tests/*.h) $(EMU_HDR) $(HDR)
T_CFLAGS  := -std=c11 -D_GNU_SOURCE $(WARN) -O1 -g -fno-omit-frame-pointer -Itests -Itests/emu -Iinclude -I$(CUDA_HOME)/include -pthread
T_RPATH   := -Wl,-rpath,'$$ORIGIN/../emu'

$(BUILD)/tests/test_shim_%: tests/test_shim_%.c $(T_HDR) $(EMU_DRV) $(EMU_RT) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -rdynamic -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcudart -lcuda -ldl -pthread

$(BUILD)/tests/test_static_%: tests/test_static_%.c $(T_HDR) $(EMU_DRV) $(EMU_RT_A) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -o $@ $< $(EMU_RT_A) -L$(BUILD)/emu $(T_RPATH) -lcuda -ldl -pthread

$(BUILD)/tests/test_unit_%: tests/test_unit_%.c $(T_HDR) $(wildcard src/*.c) $(EMU_DRV) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -fvisibility=hidden -o $@ $< $(filter-out src/hook_%.c,$(SRC)) -L$(BUILD)/emu $(T_RPATH) -lcuda -ldl -pthread

$(BUILD)/tests/test_emu_%: tests/test_emu_%.c $(T_HDR) $(EMU_DRV) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcuda -ldl -pthread

deps:
	@sh tests/setup.sh

# ---- sanitizer builds: the library and the unit tests with the invariant checks compiled in
# (VS_DEBUG=2) under AddressSanitizer + UndefinedBehaviorSanitizer (build/asan) and
# ThreadSanitizer (build/tsan). The shim tests' programs run unchanged, with the
# instrumented library preloaded after the sanitizer's runtime.
SAN_asan  := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
SAN_tsan  := -fsanitize=thread
DBG_FLAGS := -O1 -g -DVS_DEBUG=2
T_UNIT_NAMES := $(patsubst tests/%.c,%,$(wildcard tests/test_unit_*.c))

define SANITIZER_BUILD
$(BUILD)/$(1)/obj/%.o: src/%.c $(HDR)
	@mkdir -p $$(@D)
	$(CC) $(DBG_FLAGS) $(SAN_$(1)) $(LIB_FLAGS) -c -o $$@ $$<
$(BUILD)/$(1)/obj/pool.o: $(wildcard src/pool_*.c)
$(BUILD)/$(1)/libvmmshim.so: $(SRC:src/%.c=$(BUILD)/$(1)/obj/%.o)
	$(CC) $(SAN_$(1)) -shared -o $$@ $$^ $(LDLIBS)
$(BUILD)/$(1)/tests/test_unit_%: tests/test_unit_%.c $(T_HDR) $(wildcard src/*.c) $(EMU_DRV)
	@mkdir -p $$(@D)
	$(CC) $(T_CFLAGS) $(DBG_FLAGS) $(SAN_$(1)) -fvisibility=hidden -o $$@ $$< $(filter-out src/hook_%.c,$(SRC)) \
	  -L$(BUILD)/emu -Wl,-rpath,'$$$$ORIGIN/../../emu' -lcuda -ldl -pthread
endef
$(eval $(call SANITIZER_BUILD,asan))
$(eval $(call SANITIZER_BUILD,tsan))
SAN_DEPS := $(BUILD)/asan/libvmmshim.so $(BUILD)/tsan/libvmmshim.so \
            $(T_UNIT_NAMES:%=$(BUILD)/asan/tests/%) $(T_UNIT_NAMES:%=$(BUILD)/tsan/tests/%)

TEST_DEPS := deps $(LIB) $(EMU_DRV) $(EMU_RT) $(EMU_RT_A) $(T_EMU) $(T_UNIT) $(T_SHIM) $(T_STATIC)

# Every CPU test on the release library, then the sanitizer pass (tests/run.sh says which tests).
test: $(TEST_DEPS) $(SAN_DEPS)
	@BUILD=$(BUILD) PYTHON=$(PYTHON) SANITIZE=1 sh tests/run.sh

# The sanitizer pass alone.
test-sanitize: $(TEST_DEPS) $(SAN_DEPS)
	@BUILD=$(BUILD) PYTHON=$(PYTHON) SANITIZE=only sh tests/run.sh

# ---- GPU (run on a machine with an NVIDIA GPU) ----
demo: $(LIB)
	@BUILD=$(BUILD) NVCC=$(NVCC) sh scripts/demo.sh

gpu-test: $(LIB)
	@BUILD=$(BUILD) NVCC=$(NVCC) PYTHON=$(PYTHON) sh tests/gpu/run.sh

bench: $(LIB)
	@BUILD=$(BUILD) NVCC=$(NVCC) PYTHON=$(PYTHON) sh bench/run.sh

# The shim's own cost per pair on the host emulation: no GPU needed (bench/cpu_pairs.c)
$(BUILD)/bench/cpu_pairs: bench/cpu_pairs.c $(EMU_DRV) $(EMU_RT) | $(BUILD)/bench
	$(CC) $(T_CFLAGS) -O2 -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcudart -lcuda -ldl -pthread

$(BUILD)/bench/cpu_frag: bench/cpu_frag.c bench/workloads.h $(EMU_DRV) $(EMU_RT) | $(BUILD)/bench
	$(CC) $(T_CFLAGS) -O2 -Ibench -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcudart -lcuda -ldl -lm -pthread

bench-cpu: $(LIB) $(BUILD)/bench/cpu_pairs $(BUILD)/bench/cpu_frag
	@BUILD=$(BUILD) sh bench/cpu_run.sh

clean:
	rm -rf $(BUILD)
