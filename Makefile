# vmmshim: build, test, benchmark.
#   make            build/libvmmshim.so and the man pages (build/vmmshim.1, vmmshim-report.1,
#                   vmmshim-replay.1, and build/vmmshim.7: every variable)
#   make demo       build and run the bundled CUDA program under the shim (needs a GPU)
#   make demo-emu   the same program in C, on the host emulation of the driver (no GPU): run
#                   under the launcher, with the shim's stats and a report of its trace
#   make test       CPU tests on the host emulation of the driver, then under sanitizers (CI runs this)
#   make test-sanitize  only the sanitizer pass
#   make gpu-test   GPU tests (needs a GPU and nvcc)
#   make bench      GPU benchmarks (needs a GPU and nvcc)
#   make bench-spread  the irregular workloads at seeds 1-5, default and small handles (GPU)
#   make bench-cpu  the shim's own costs on the host emulation (no GPU)
#   make mutation   plants known bugs one at a time in a copy of the tree and reports which the
#                   tests catch (tests/mutation.py; MUTATIONS="name ..." for some of them)
#   make install    libvmmshim.so, the launcher and tools, vmmshim.h, vmmshim.pc, the man pages and
#                   the Python client and module (lib/vmmshim/python) under $(DESTDIR)$(PREFIX)
#                   (PREFIX=/usr/local); make uninstall removes them
# Every target that compiles runs scripts/deps.sh first: it checks for uthash.h (installs
# uthash-dev with apt-get when root) and stops with one line saying what to install when it
# cannot. UTHASH_INCLUDE=DIR: uthash.h is in DIR (added with -I).

CUDA_HOME ?= /usr/local/cuda
CC        ?= cc
NVCC      ?= $(CUDA_HOME)/bin/nvcc
BUILD     ?= build
PYTHON    ?= python3
PREFIX    ?= /usr/local
DESTDIR   ?=
UTHASH_INCLUDE ?=
UTHASH_CFLAGS  := $(if $(UTHASH_INCLUDE),-I$(UTHASH_INCLUDE))

WARN      := -Wall -Wextra -Werror
LIB_FLAGS := -std=c11 -D_GNU_SOURCE $(WARN) -fPIC -fno-omit-frame-pointer -fvisibility=hidden -ftls-model=initial-exec \
             -Iinclude $(UTHASH_CFLAGS) -I$(CUDA_HOME)/include -pthread
CFLAGS    ?= -O2 -g
CFLAGS    += $(LIB_FLAGS)
LDLIBS    := -ldl -pthread

# src/<layer>/*.c, one folder per layer (docs/design.md). src/pool/pool_*.c are parts of
# pool.c's translation unit (it includes them): not compiled alone.
SRC       := $(filter-out src/pool/pool_%.c,$(wildcard src/*/*.c))
HDR       := include/vmmshim.h $(wildcard include/vmmshim/*.h)
OBJ       := $(SRC:src/%.c=$(BUILD)/obj/%.o)
SRC_ALL   := $(wildcard src/*/*.c)
LIB       := $(BUILD)/libvmmshim.so
MAN       := $(BUILD)/vmmshim.1
MAN7      := $(BUILD)/vmmshim.7
MAN_TOOLS := $(BUILD)/vmmshim-report.1 $(BUILD)/vmmshim-replay.1
# vmmshim-report is a script and its package (scripts/vmmshim_report), which the script finds at
# ../share/vmmshim/python next to itself when installed.
PYPKG     := $(wildcard scripts/vmmshim_report/*.py) scripts/vmmshim_report/page.js
PC        := $(BUILD)/vmmshim.pc

.PHONY: all demo demo-emu test test-sanitize gpu-test bench bench-spread bench-cpu mutation clean deps install uninstall FORCE
all: $(LIB) $(MAN) $(MAN7) $(MAN_TOOLS)

# The dependency check: a prerequisite of every target, order-only for each object, so that
# with -j nothing compiles before it has finished. It runs on every make and is silent and
# instant when all is there. For `make test` it also wants chromium, pkg-config and libunwind.
deps:
	@UTHASH_INCLUDE='$(UTHASH_INCLUDE)' sh scripts/deps.sh $(if $(filter test test-sanitize,$(MAKECMDGOALS)),--test)

$(BUILD)/obj/%.o: src/%.c $(HDR) | $(BUILD)/obj deps
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/obj/pool/pool.o: $(wildcard src/pool/pool_*.c)

$(LIB): $(OBJ)
	$(CC) -shared -o $@ $(OBJ) $(LDLIBS)

$(BUILD) $(BUILD)/obj $(BUILD)/emu $(BUILD)/tests $(BUILD)/bench:
	mkdir -p $@

# The man pages, made from each tool's --help (one source for both).
$(MAN): scripts/vmmshim scripts/gen-man.sh | $(BUILD)
	sh scripts/gen-man.sh scripts/vmmshim > $@.tmp && mv $@.tmp $@

# vmmshim(7), every VMMSHIM_* variable: the values each accepts and its default come from the
# shim's own option table (src/base/config.c, printed by man/options.c), the prose from
# man/variables.txt; scripts/gen-man7.sh puts them together and fails on a variable one has and
# the other lacks.
$(BUILD)/vmmshim-options: man/options.c src/base/config.c $(HDR) | $(BUILD)
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) -O1 -Iinclude -I$(CUDA_HOME)/include -o $@ man/options.c src/base/config.c

$(MAN7): $(BUILD)/vmmshim-options man/variables.txt scripts/gen-man7.sh include/vmmshim.h | $(BUILD)
	$(BUILD)/vmmshim-options > $@.options
	sh scripts/gen-man7.sh $@.options man/variables.txt \
	  "$$(sed -n 's/^#define VMMSHIM_VERSION "\(.*\)"$$/\1/p' include/vmmshim.h)" > $@.tmp && mv $@.tmp $@
	rm -f $@.options

$(BUILD)/vmmshim-%.1: scripts/vmmshim-% $(PYPKG) scripts/gen-man.sh | $(BUILD)
	PYTHON=$(PYTHON) sh scripts/gen-man.sh scripts/vmmshim-$* > $@.tmp && mv $@.tmp $@

# The pkg-config file, remade on every make install for the PREFIX given. Cflags only: a program
# never links against the shim (it is preloaded; vmmshim.h's functions are found with dlsym).
$(PC): include/vmmshim.h FORCE | $(BUILD)
	@printf '%s\n' 'prefix=$(PREFIX)' 'exec_prefix=$${prefix}' 'libdir=$${prefix}/lib' \
	  'includedir=$${prefix}/include' '' 'Name: vmmshim' \
	  'Description: CUDA device allocations served from pools on the driver VMM API (LD_PRELOAD)' \
	  "Version: $$(sed -n 's/^#define VMMSHIM_VERSION "\(.*\)"$$/\1/p' include/vmmshim.h)" \
	  'Cflags: -I$${includedir}' > $@

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

# NVML's few calls the residue makes, for test_shim_residue: opened by path, in a folder of its own
# that no search path names (the other tests run without NVML).
EMU_NVML   := $(BUILD)/emu/nvml/libnvidia-ml.so.1
$(EMU_NVML): tests/emu/nvml_emu.c $(EMU_HDR) $(EMU_DRV) | $(BUILD)/emu
	mkdir -p $(BUILD)/emu/nvml
	$(CC) $(EMU_CFLAGS) -shared -Wl,-soname,libnvidia-ml.so.1 -o $@ $< -L$(BUILD)/emu -Wl,-rpath,'$$ORIGIN/..' -lcuda

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
T_CFLAGS  := -std=c11 -D_GNU_SOURCE $(WARN) -O1 -g -fno-omit-frame-pointer -Itests -Itests/emu -Iinclude \
             $(UTHASH_CFLAGS) -I$(CUDA_HOME)/include -pthread
T_RPATH   := -Wl,-rpath,'$$ORIGIN/../emu'

$(BUILD)/tests/test_shim_%: tests/test_shim_%.c $(T_HDR) $(EMU_DRV) $(EMU_RT) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -rdynamic -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcudart -lcuda -ldl -pthread

$(BUILD)/tests/test_static_%: tests/test_static_%.c $(T_HDR) $(EMU_DRV) $(EMU_RT_A) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -o $@ $< $(EMU_RT_A) -L$(BUILD)/emu $(T_RPATH) -lcuda -ldl -pthread

# test_static_control.c is test_shim_control.c built with the static runtime.
$(BUILD)/tests/test_static_control: tests/test_shim_control.c

# test_shim_rules: two shared objects whose allocations `lib:` tag rules tell apart, and a
# stand-in for an allocator library (librmm.so) that they also allocate through.
$(BUILD)/tests/librmm.so: tests/rules_lib.c $(EMU_RT) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -fPIC -shared -DRULES_FN=rules_pool_alloc -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcudart
$(BUILD)/tests/librules_%.so: tests/rules_lib.c $(BUILD)/tests/librmm.so $(EMU_RT) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -fPIC -shared -DRULES_FN=rules_lib_$*_alloc -DRULES_VIA=rules_lib_$*_via -o $@ $< \
	  -L$(BUILD)/tests -L$(BUILD)/emu $(T_RPATH) -Wl,-rpath,'$$ORIGIN' -lrmm -lcudart
$(BUILD)/tests/test_shim_rules: tests/test_shim_rules.c $(BUILD)/tests/librules_a.so $(BUILD)/tests/librules_b.so \
                                $(T_HDR) $(EMU_DRV) $(EMU_RT) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -rdynamic -o $@ $< -L$(BUILD)/tests -L$(BUILD)/emu $(T_RPATH) -Wl,-rpath,'$$ORIGIN' -lrules_a \
	  -lrules_b -lrmm -lcudart -lcuda -ldl -pthread

$(BUILD)/tests/test_unit_%: tests/test_unit_%.c $(T_HDR) $(SRC_ALL) $(EMU_DRV) | $(BUILD)/tests deps
	$(CC) $(T_CFLAGS) -fvisibility=hidden -o $@ $< $(filter-out src/hook/%.c,$(SRC)) -L$(BUILD)/emu $(T_RPATH) -lcuda -ldl -pthread

# test_shim_residue links a library that makes device memory of its own (tests/lib/residue_helper.c).
$(BUILD)/tests/libresidue_helper.so: tests/lib/residue_helper.c tests/lib/residue_helper.h $(EMU_DRV) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -fPIC -shared -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcuda
$(BUILD)/tests/test_shim_residue: tests/test_shim_residue.c $(BUILD)/tests/libresidue_helper.so $(T_HDR) $(EMU_DRV) $(EMU_RT) $(EMU_NVML) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -rdynamic -o $@ $< -L$(BUILD)/tests -lresidue_helper -Wl,-rpath,'$$ORIGIN' -L$(BUILD)/emu $(T_RPATH) -lcudart -lcuda -ldl -pthread

$(BUILD)/tests/test_emu_%: tests/test_emu_%.c $(T_HDR) $(EMU_DRV) | $(BUILD)/tests
	$(CC) $(T_CFLAGS) -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcuda -ldl -pthread

# ---- sanitizer builds: the library and the unit tests with the invariant checks compiled in
# (VS_DEBUG=2) under AddressSanitizer + UndefinedBehaviorSanitizer (build/asan) and
# ThreadSanitizer (build/tsan). The shim tests' programs run unchanged, with the
# instrumented library preloaded after the sanitizer's runtime.
SAN_asan  := -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer
SAN_tsan  := -fsanitize=thread
DBG_FLAGS := -O1 -g -DVS_DEBUG=2
T_UNIT_NAMES := $(patsubst tests/%.c,%,$(wildcard tests/test_unit_*.c))

define SANITIZER_BUILD
$(BUILD)/$(1)/obj/%.o: src/%.c $(HDR) | deps
	@mkdir -p $$(@D)
	$(CC) $(DBG_FLAGS) $(SAN_$(1)) $(LIB_FLAGS) -c -o $$@ $$<
$(BUILD)/$(1)/obj/pool/pool.o: $(wildcard src/pool/pool_*.c)
$(BUILD)/$(1)/libvmmshim.so: $(SRC:src/%.c=$(BUILD)/$(1)/obj/%.o)
	$(CC) $(SAN_$(1)) -shared -o $$@ $$^ $(LDLIBS)
$(BUILD)/$(1)/tests/test_unit_%: tests/test_unit_%.c $(T_HDR) $(SRC_ALL) $(EMU_DRV) | deps
	@mkdir -p $$(@D)
	$(CC) $(T_CFLAGS) $(DBG_FLAGS) $(SAN_$(1)) -fvisibility=hidden -o $$@ $$< $(filter-out src/hook/%.c,$(SRC)) \
	  -L$(BUILD)/emu -Wl,-rpath,'$$$$ORIGIN/../../emu' -lcuda -ldl -pthread
endef
$(eval $(call SANITIZER_BUILD,asan))
$(eval $(call SANITIZER_BUILD,tsan))
SAN_DEPS := $(BUILD)/asan/libvmmshim.so $(BUILD)/tsan/libvmmshim.so \
            $(T_UNIT_NAMES:%=$(BUILD)/asan/tests/%) $(T_UNIT_NAMES:%=$(BUILD)/tsan/tests/%)

TEST_DEPS := deps $(LIB) $(MAN) $(MAN7) $(EMU_DRV) $(EMU_RT) $(EMU_RT_A) $(T_EMU) $(T_UNIT) $(T_SHIM) $(T_STATIC) \
             $(BUILD)/bench/frag_floor $(BUILD)/bench/cpu_frag

# Every CPU test on the release library, then the sanitizer pass (tests/run.sh says which tests).
test: $(TEST_DEPS) $(SAN_DEPS)
	@BUILD=$(BUILD) PYTHON=$(PYTHON) SANITIZE=1 sh tests/run.sh

# The sanitizer pass alone.
test-sanitize: $(TEST_DEPS) $(SAN_DEPS)
	@BUILD=$(BUILD) PYTHON=$(PYTHON) SANITIZE=only sh tests/run.sh

# Each planted bug of tests/mutation.py alone in a copy of the tree (the working tree is not
# touched), its tests run there: which survive. Not part of make test: it takes a while.
mutation: deps
	@PYTHON=$(PYTHON) $(PYTHON) tests/mutation.py $(MUTATIONS)

# ---- GPU (run on a machine with an NVIDIA GPU) ----
demo: deps $(LIB)
	@BUILD=$(BUILD) NVCC=$(NVCC) sh scripts/demo.sh

# ---- the demo on the host emulation of the driver and runtime (no GPU). Linked without an
# rpath, as a program of one's own would be: scripts/demo.sh runs it with
# LD_LIBRARY_PATH=$(BUILD)/emu, the way to run any program on the emulation.
$(BUILD)/demo_emu: examples/demo_emu.c include/vmmshim.h $(EMU_RT) | $(BUILD) deps
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) -O1 -g -Iinclude -I$(CUDA_HOME)/include -o $@ $< -L$(BUILD)/emu -lcudart -ldl

demo-emu: deps $(LIB) $(EMU_DRV) $(EMU_RT) $(BUILD)/demo_emu
	@BUILD=$(BUILD) PYTHON=$(PYTHON) CUDA_HOME=$(CUDA_HOME) DEMO_EMU=1 sh scripts/demo.sh

gpu-test: deps $(LIB)
	@BUILD=$(BUILD) NVCC=$(NVCC) PYTHON=$(PYTHON) sh tests/gpu/run.sh

bench: deps $(LIB)
	@BUILD=$(BUILD) NVCC=$(NVCC) PYTHON=$(PYTHON) sh bench/run.sh

bench-spread: deps $(LIB)
	@BUILD=$(BUILD) NVCC=$(NVCC) PYTHON=$(PYTHON) BENCH_SPREAD=1 BENCH_ONLY=spread- BENCH_TAG=spread \
	  BENCH_BUDGET=$${BENCH_BUDGET:-540} sh bench/run.sh

# ---- the shim's own costs on the host emulation: no GPU needed (bench/cpu_*.c) ----
$(BUILD)/bench/cpu_pairs: bench/cpu_pairs.c $(EMU_DRV) $(EMU_RT) | $(BUILD)/bench
	$(CC) $(T_CFLAGS) -O2 -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcudart -lcuda -ldl -pthread

$(BUILD)/bench/cpu_frag: bench/cpu_frag.c bench/workloads.h $(EMU_DRV) $(EMU_RT) | $(BUILD)/bench
	$(CC) $(T_CFLAGS) -O2 -Ibench -o $@ $< -L$(BUILD)/emu $(T_RPATH) -lcudart -lcuda -ldl -lm -pthread

# The least fixed arena that serves each irregular workload with no driver call (no CUDA).
$(BUILD)/bench/frag_floor: bench/frag_floor.c bench/workloads.h include/vmmshim/policy.h | $(BUILD)/bench
	$(CC) -std=c11 -D_GNU_SOURCE $(WARN) -O2 -Ibench -Iinclude -o $@ $< -lm

bench-cpu: deps $(LIB) $(BUILD)/bench/cpu_pairs $(BUILD)/bench/cpu_frag $(BUILD)/bench/frag_floor
	@BUILD=$(BUILD) sh bench/cpu_run.sh

# ---- install: PREFIX (default /usr/local), DESTDIR for staging ----
# The launcher finds the library at ../lib/libvmmshim.so next to itself, and the client of
# vmmshim ctl / top at ../lib/vmmshim/python/vmmshim_ctl.py, so the layout under PREFIX is fixed:
# bin, lib, lib/pkgconfig, lib/vmmshim/python (the vmmshim module: PYTHONPATH=$$(vmmshim ctl
# --python-path)), include, share/man/man1 and man7, share/vmmshim.
PYDIR     := share/vmmshim/python/vmmshim_report
PY_DIR    := lib/vmmshim/python
PY_MOD    := $(wildcard scripts/python/vmmshim/*.py)
# vmmshim --as torch_memory_saver puts this package's directory first on PYTHONPATH.
PY_AS     := scripts/python/vmmshim/compat/torch_memory_saver/__init__.py
INSTALLED := $(PREFIX)/lib/libvmmshim.so $(PREFIX)/lib/pkgconfig/vmmshim.pc \
             $(PREFIX)/bin/vmmshim $(PREFIX)/bin/vmmshim-report $(PREFIX)/bin/vmmshim-replay \
             $(PREFIX)/include/vmmshim.h $(PREFIX)/share/man/man1/vmmshim.1 $(PREFIX)/share/man/man7/vmmshim.7 \
             $(MAN_TOOLS:$(BUILD)/%=$(PREFIX)/share/man/man1/%) \
             $(PYPKG:scripts/vmmshim_report/%=$(PREFIX)/$(PYDIR)/%) \
             $(PREFIX)/$(PY_DIR)/vmmshim_ctl.py $(PY_MOD:scripts/python/%=$(PREFIX)/$(PY_DIR)/%) \
             $(PY_AS:scripts/python/%=$(PREFIX)/$(PY_DIR)/%)
INSTDIR   := $(DESTDIR)$(PREFIX)

install: $(LIB) $(MAN) $(MAN7) $(MAN_TOOLS) $(PC)
	install -d -m 755 $(INSTDIR)/bin $(INSTDIR)/lib/pkgconfig $(INSTDIR)/include $(INSTDIR)/share/man/man1 \
	  $(INSTDIR)/share/man/man7
	install -m 644 $(LIB) $(INSTDIR)/lib/libvmmshim.so
	install -m 644 $(PC) $(INSTDIR)/lib/pkgconfig/vmmshim.pc
	install -m 755 scripts/vmmshim scripts/vmmshim-report scripts/vmmshim-replay $(INSTDIR)/bin/
	install -d -m 755 $(INSTDIR)/$(PYDIR)
	install -m 644 $(PYPKG) $(INSTDIR)/$(PYDIR)/
	install -m 644 include/vmmshim.h $(INSTDIR)/include/vmmshim.h
	install -m 644 $(MAN) $(INSTDIR)/share/man/man1/vmmshim.1
	install -m 644 $(MAN7) $(INSTDIR)/share/man/man7/vmmshim.7
	install -m 644 $(MAN_TOOLS) $(INSTDIR)/share/man/man1/
	install -d -m 755 $(INSTDIR)/$(PY_DIR)/vmmshim
	install -m 644 scripts/python/vmmshim_ctl.py $(INSTDIR)/$(PY_DIR)/vmmshim_ctl.py
	install -m 644 $(PY_MOD) $(INSTDIR)/$(PY_DIR)/vmmshim/
	install -d -m 755 $(INSTDIR)/$(PY_DIR)/vmmshim/compat/torch_memory_saver
	install -m 644 $(PY_AS) $(INSTDIR)/$(PY_DIR)/vmmshim/compat/torch_memory_saver/

# Removes the files make install puts there; directories are left, but for the report package's
# own (with the bytecode Python may have cached there) and the module's byte-code cache.
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALLED))
	rm -rf $(INSTDIR)/$(PYDIR)/__pycache__ $(INSTDIR)/$(PY_DIR)/vmmshim/__pycache__ \
	  $(INSTDIR)/$(PY_DIR)/vmmshim/compat/torch_memory_saver/__pycache__
	rmdir $(INSTDIR)/$(PY_DIR)/vmmshim/compat/torch_memory_saver $(INSTDIR)/$(PY_DIR)/vmmshim/compat 2>/dev/null || :
	rmdir $(INSTDIR)/$(PYDIR) $(INSTDIR)/share/vmmshim/python $(INSTDIR)/share/vmmshim 2>/dev/null || :

clean:
	rm -rf $(BUILD)
