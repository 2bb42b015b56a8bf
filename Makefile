# Thin wrapper over CMake: `make demo` and `make test` are all a new user needs.
BUILD      ?= build
ASAN_BUILD ?= build-asan
TSAN_BUILD ?= build-tsan
JOBS       ?= 2
# pocketsphinx-en-us: the CMU Pronouncing Dictionary (without stress) that examples/g2p trains on;
# fortunes: the text examples/char_lm trains on;
# openmpi-bin, libopenmpi-dev: mpirun and MPI for distributed/ (data-parallel training);
# dataset-fashion-mnist: the gzipped IDX files examples/fashion_mnist trains on, read with zlib;
# libdnnl-dev: oneDNN, Float32 convolutions and products on the CPU (its CMake config also needs
# ocl-icd-opencl-dev, which libdnnl-dev does not pull in);
# libblis-serial-dev: BLIS, the products' library on AVX2 CPUs (ops/blis.cpp opens it at run time,
# its header types the calls).
PACKAGES   := g++ cmake make libopenblas-openmp-dev libfmt-dev libboost-test-dev \
              libcli11-dev nlohmann-json3-dev pocketsphinx-en-us fortunes openmpi-bin \
              libopenmpi-dev dataset-fashion-mnist zlib1g-dev libdnnl-dev ocl-icd-opencl-dev \
              libblis-serial-dev
SUDO       := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# doxygen: the API reference from the public headers (make docs).
PACKAGES   += doxygen

.PHONY: all deps build demo test test-asan test-tsan bench docs format clean

all: build

deps:
	@missing=""; for p in $(PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)

demo: build
	./examples/run_demo.sh $(BUILD)

test: build
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)

test-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_SANITIZE=ON \
	  -DEMBER_BUILD_EXAMPLES=OFF -DEMBER_BUILD_BENCH=OFF
	cmake --build $(ASAN_BUILD) -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 \
	  LSAN_OPTIONS=use_tls=0:suppressions=$(CURDIR)/tests/lsan.supp \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure -j$(JOBS)

# ThreadSanitizer over the concurrency tests. One OpenMP/OpenBLAS thread per caller: libgomp is
# not instrumented, and what is tested is Ember's own state shared between the callers' threads.
test-tsan: deps
	cmake -S . -B $(TSAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_TSAN=ON \
	  -DEMBER_BUILD_EXAMPLES=OFF -DEMBER_BUILD_BENCH=OFF
	cmake --build $(TSAN_BUILD) -j$(JOBS) --target ember_tests
	OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 EMBER_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1 \
	  $(TSAN_BUILD)/tests/ember_tests --run_test=test_threads

bench: build
	./bench/run.sh $(BUILD)

# The API reference from the public headers (Doxyfile, docs/api/): $(BUILD)/docs/html/index.html.
# A warning fails the target (they go to $(BUILD)/docs/warnings.log).
docs: deps
	rm -rf $(BUILD)/docs && mkdir -p $(BUILD)/docs
	EMBER_DOCS_OUT=$(BUILD)/docs doxygen Doxyfile
	@if [ -s $(BUILD)/docs/warnings.log ]; then cat $(BUILD)/docs/warnings.log; exit 1; fi
	@echo "API reference: $(BUILD)/docs/html/index.html"

format:
	clang-format -i $$(git ls-files '*.h' '*.cpp')

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD)
