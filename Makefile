# ringtrain — `make test` is what CI runs (.ci/run); `make demo` shows the main job.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := test

GO       ?= go
BIN      ?= bin
# A count, not a duration: with a duration, Go 1.26's fuzz coordinator can
# fail at the deadline with "context deadline exceeded" and no crasher
# (golang/go#75804, fixed in 1.27). 5000 inputs take 1–6 s here (the
# p2p handshakes and the remembered peers the longest).
FUZZTIME ?= 1000x
# Every fuzz target, as package:Target; `make test` runs each for FUZZTIME
# (short, to keep make test under 10 minutes; make fuzz FUZZTIME=2000000x goes deeper).
FUZZ     := ./ring:FuzzRecv ./ring:FuzzRecvNarrow ./ring:FuzzRecvI8 ./data:FuzzReadIDX ./data:FuzzReadCSV ./data:FuzzReadTable ./p2p:FuzzReadHello ./data:FuzzParseManifest ./cmd/ringtrain:FuzzParseJobConfig ./train:FuzzControlMessage ./train/pipeline:FuzzReadFrame ./train/trace:FuzzRead ./p2p:FuzzStatements ./p2p:FuzzLinkHello ./p2p:FuzzSecureHello ./p2p:FuzzLinkRecords ./p2p:FuzzLANAddrs ./p2p:FuzzDataRequest ./p2p:FuzzDataReply ./train:FuzzCheckpoint ./train/sparse:FuzzDecode ./train/sparse:FuzzDecodeParts ./p2p:FuzzCheckRow ./p2p:FuzzTimeProbe ./p2p:FuzzKnownPeers

MODEL ?= mlp

.PHONY: check fuzz-build test-processes test-norace test-attack bench-byzantine test-deps test-prometheus test-netns test-netns-churn test-arm64 test-onnx onnx-runtime onnx-proto build build-openblas openblas cuda cuda-test gpu-pack cuda-apt cuda-fetch cuda-check cuda-toolkit ptx test test-openblas vet fuzz lint fmt-check bench bench-data bench-train bench-train-cnn bench-cpu bench-gpt bench-gpt-quality bench-elastic bench-nat bench-procs bench-slow bench-gpt-slow bench-deadline bench-overlap bench-served bench-pipeline bench-flood bench-planes bench-churn bench-topology bench-donors fashion-mnist fortunes testdata demo demo-gpt clean

build:
	$(GO) build -o $(BIN)/ringtrain ./cmd/ringtrain

# The same program with OpenBLAS doing gorgonia's own matrix products (cgo,
# -tags netlib). The built-in layers multiply with train/gemm in every
# build, so this gains nothing on them; it stays for products gorgonia
# still computes itself.
# (gcc prints the bare name back when it cannot find the library.)
OPENBLAS_OK = command -v gcc >/dev/null && [ "$$(gcc -print-file-name=libopenblas.so)" != libopenblas.so ]
openblas:
	@$(OPENBLAS_OK) || { (apt-get install -y -qq gcc libopenblas-dev || (apt-get update -qq && apt-get install -y -qq gcc libopenblas-dev)) >/dev/null 2>&1 || echo "could not install libopenblas-dev"; }

build-openblas: openblas
	CGO_ENABLED=1 $(GO) build -tags netlib -o $(BIN)/ringtrain-openblas ./cmd/ringtrain

# train/gemm's products against OpenBLAS's sgemm, an implementation
# written apart from ours, over random shapes, transposes and strides,
# when OpenBLAS can be had; says so when it cannot. (Running the gradient
# tests under -tags netlib checked nothing: every layer's product is
# train/gemm's in every build.)
test-openblas: openblas
	@if $(OPENBLAS_OK); then \
	  CGO_ENABLED=1 $(GO) test -tags netlib -count=1 ./train/gemm/openblascheck; \
	else echo "test-openblas: SKIPPED, libopenblas-dev is not installed and could not be"; fi

vet:
	$(GO) vet ./...

# The edit-test loop (≤ 90 s here): vet, go.mod tidy, the format check and
# the unit tests — go test -short leaves out what starts processes, swarms
# of hosts or takes seconds; make test runs everything.
check: vet fmt-check
	$(GO) mod tidy -diff
	$(GO) test -short -count=1 ./...

# The packages' tests under the race detector (cmd/ringtrain's in-process
# ones beside them: -short leaves out its process tests). Meanwhile, in the
# background, what the later steps need is installed and the CUDA and
# arm64 checks run (compiling and qemu, while the tests wait on peers).
# Then the churn run — the longest, floored by its two halves of two
# minutes — starts at once, and beside it everything else runs one
# after another: the process tests, the other netns tests, the fuzzers.
test: vet build
	@{ $(MAKE) --no-print-directory test-deps && $(MAKE) --no-print-directory cuda-check && \
	  $(MAKE) --no-print-directory test-arm64 && \
	  $(MAKE) --no-print-directory fuzz-build FUZZBIN=$(abspath $(BIN))/fuzz; } >$(BIN)/test-bg.log 2>&1 & bg=$$!; \
	$(GO) test -race -short -count=1 ./cmd/ringtrain >$(BIN)/test-cmd.log 2>&1 & cmd=$$!; \
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v '/cmd/ringtrain$$') && rc=0 || rc=$$?; \
	wait $$cmd && cmdrc=0 || cmdrc=$$?; cat $(BIN)/test-cmd.log; \
	wait $$bg && bgrc=0 || bgrc=$$?; cat $(BIN)/test-bg.log; \
	[ $$rc = 0 ] && [ $$cmdrc = 0 ] && [ $$bgrc = 0 ]
	@$(MAKE) --no-print-directory test-netns-churn >$(BIN)/test-churn.log 2>&1 & churn=$$!; \
	$(MAKE) --no-print-directory test-processes test-norace test-netns test-onnx test-openblas test-prometheus test-attack fuzz \
	  FUZZBIN=$(abspath $(BIN))/fuzz && \
	  rc=0 || rc=$$?; wait $$churn && crc=0 || crc=$$?; cat $(BIN)/test-churn.log; \
	[ $$rc = 0 ] && [ $$crc = 0 ]

# cmd/ringtrain's tests, the process tests among them, which start
# bin/ringtrain (RINGTRAIN_TEST_BIN) and wait on it: without the race
# detector, as the peers run without it too (under it they train several
# times slower, and the code they run is tested under it in-process in
# train/elastic, p2p and ring; make test runs the package's in-process
# tests under it, -short).
test-processes: build
	RINGTRAIN_TEST_BIN=$(abspath $(BIN))/ringtrain $(GO) test -count=1 ./cmd/ringtrain

# The kernels' largest exact-bit cases, which the race detector makes 30
# times slower and has nothing to see in (one goroutine each): run
# without it.
test-norace:
	$(GO) test -count=1 ./train/gemm

# Members that lie with their updates, as figures: testdata/bench-byzantine.py
# runs 4 peers with 1 attacker and 8 with 2, each attack, three job seeds
# each (RUNS; the table holds medians), in robust DiLoCo
# rounds and in every-step rings with update checks, on the full
# Fashion-MNIST; clean runs on non-IID shards of testdata's subset; and the
# clean job with the checks on and off in turn. MODEL=gpt SIZES=4:1 with
# fortunes for DATA runs the GPT (validation loss; see the script).
bench-byzantine: fashion-mnist
	$(GO) build -tags ringtrain_attack -o $(BIN)/ringtrain-attack ./cmd/ringtrain
	python3 testdata/bench-byzantine.py $(BIN)/ringtrain-attack $(FASHION) $(abspath testdata/fashion-mnist)

# Members that lie with their updates: peers of a build tagged
# ringtrain_attack send their pseudo-gradients altered (RINGTRAIN_ATTACK),
# and the honest ones must name and drop them; the default binary must not
# hold the attack at all.
test-attack: build
	$(GO) test -tags ringtrain_attack -count=1 -run 'Byzantine' ./cmd/ringtrain
	@if $(GO) tool nm $(BIN)/ringtrain | grep -q 'ringtrain/train\.attack'; then \
	  echo "test-attack: the default binary holds train.attack; only builds tagged ringtrain_attack may"; exit 1; fi; \
	echo "test-attack: the default binary holds no attack"

# What make test's later steps need from Debian and npm, in one apt-get
# (dpkg takes one at a time) and one npm install; each step checks again
# and says SKIPPED where something could not be had.
TEST_DEBS = gcc libopenblas-dev qemu-user iptables python3-onnx prometheus curl
test-deps:
	@missing=$$(for p in $(TEST_DEBS); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then apt-get install -y -qq $$missing >/dev/null 2>&1 || \
	  (apt-get update -qq && apt-get install -y -qq $$missing) >/dev/null 2>&1 || echo "test-deps: could not install $$missing"; fi
	@$(MAKE) --no-print-directory onnx-runtime cuda-fetch

# The CPU kernels on arm64, under qemu-user (Debian's qemu-user, installed
# here): the fused Go kernel (gemm's on arm64) must give the bits of the
# exact one, as amd64's assembly does, and the layers their definitions.
test-arm64:
	@command -v qemu-aarch64 >/dev/null || (apt-get install -y -qq qemu-user || (apt-get update -qq && apt-get install -y -qq qemu-user)) >/dev/null 2>&1 || true
	@if ! command -v qemu-aarch64 >/dev/null; then echo "test-arm64: SKIPPED (no qemu-aarch64)"; exit 0; fi; \
	set -e; dir=$$(mktemp -d); trap 'rm -rf $$dir' EXIT; \
	for pkg in gemm vec; do GOARCH=arm64 $(GO) test -c -o $$dir/$$pkg.test ./train/$$pkg; \
	  echo "test-arm64: train/$$pkg under qemu-aarch64"; (cd train/$$pkg && qemu-aarch64 $$dir/$$pkg.test -test.short); done; \
	GOARCH=arm64 $(GO) test -c -o $$dir/train.test ./train; \
	echo "test-arm64: train's layer and bit tests under qemu-aarch64"; \
	(cd train && qemu-aarch64 $$dir/train.test -test.short -test.run 'ConvMatches|SameBitsWhatever|EveryLayerGradient|BigBatch')

# ONNX export checked by real tools: onnxruntime (npm's onnxruntime-node,
# whose CPU build is in the npm tarball; ONNXRUNTIME_NODE_INSTALL=skip stops
# its install script fetching GPU builds from nuget) runs the exported cnn
# and mlp, and the onnx package's checker (Debian's python3-onnx) checks
# them. Installed into ONNX_CACHE once; SKIPPED where they cannot be had.
ONNX_CACHE ?= $(HOME)/.cache/ringtrain-onnx
ORT_VERSION = 1.23.0
onnx-runtime:
	@[ -e $(ONNX_CACHE)/node_modules/onnxruntime-node/package.json ] || { command -v npm >/dev/null || \
	  (apt-get install -y -qq nodejs npm || (apt-get update -qq && apt-get install -y -qq nodejs npm)) >/dev/null 2>&1; \
	  mkdir -p $(ONNX_CACHE) && cd $(ONNX_CACHE) && ONNXRUNTIME_NODE_INSTALL=skip npm install --no-audit --no-fund --loglevel=error \
	    onnxruntime-node@$(ORT_VERSION) >/dev/null 2>&1 || echo "onnx-runtime: could not install onnxruntime-node"; }
	@/usr/bin/python3 -c 'import onnx' 2>/dev/null || (apt-get install -y -qq python3-onnx || (apt-get update -qq && apt-get install -y -qq python3-onnx)) >/dev/null 2>&1 || \
	  echo "onnx-runtime: could not install python3-onnx"

test-onnx: onnx-runtime
	@if [ -e $(ONNX_CACHE)/node_modules/onnxruntime-node/package.json ] && /usr/bin/python3 -c 'import onnx' 2>/dev/null; then \
	  RINGTRAIN_ONNXRUNTIME=$(ONNX_CACHE)/node_modules RINGTRAIN_ONNX_PYTHON=/usr/bin/python3 $(GO) test -count=1 -run 'Runtime' -v ./train/onnx | grep -E '^(---|ok|FAIL|PASS)|onnx_test|export_test'; \
	else echo "test-onnx: SKIPPED, onnxruntime-node or python3-onnx could not be installed"; fi

# Remakes train/onnx/onnxpb/onnx.pb.go from onnx.proto (ONNX 1.12's, from
# Debian's python3-onnx) with protoc and protoc-gen-go at go.mod's
# google.golang.org/protobuf version. Not needed to build: the Go is committed.
onnx-proto:
	@command -v protoc >/dev/null || (apt-get install -y -qq protobuf-compiler || (apt-get update -qq && apt-get install -y -qq protobuf-compiler)) >/dev/null 2>&1
	GOBIN=$(abspath $(BIN)) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go
	cd train/onnx/onnxpb && protoc --plugin=protoc-gen-go=$(abspath $(BIN))/protoc-gen-go --go_out=. --go_opt=paths=source_relative \
	  --go_opt=Monnx.proto=github.com/ringtrain/ringtrain/train/onnx/onnxpb onnx.proto

# The alerting rules (cmd/ringtrain/prometheus) checked and unit-tested by
# Prometheus' own promtool, then a real Prometheus scraping a training peer
# with the rules loaded: libp2p's series and ringtrain's must be there.
test-prometheus: build
	@if command -v promtool >/dev/null && command -v prometheus >/dev/null && command -v curl >/dev/null; then \
	  cd cmd/ringtrain/prometheus && promtool check rules alerts.yml && promtool test rules alerts_test.yml && cd - >/dev/null && \
	  bash testdata/prometheus-scrape.sh $(BIN)/ringtrain; \
	else echo "test-prometheus: SKIPPED, Debian's prometheus (promtool) or curl is not installed and could not be"; fi

# Four peers in four network namespaces behind a bridge, 1 Gbit/s links;
# one is SIGKILLed mid-epoch and the other three must finish in step. A
# pipeline job (2 × 2) that loses a peer, then admits it again. Then
# four peers behind two masquerading NAT routers (iptables, installed
# here), a bootstrap peer that relays on the public side: the ring forms
# through AutoNAT, relays and hole punching, survives a SIGKILL, and admits
# a replacement. Needs root and iproute2; says SKIPPED otherwise.
test-netns: build
	@command -v iptables >/dev/null || (apt-get install -y -qq iptables || (apt-get update -qq && apt-get install -y -qq iptables)) >/dev/null 2>&1 || echo "could not install iptables"
	bash testdata/netns-elastic.sh $(BIN)/ringtrain
	bash testdata/netns-pipeline.sh $(BIN)/ringtrain
	bash testdata/netns-nat.sh $(BIN)/ringtrain
	bash testdata/netns-served.sh $(BIN)/ringtrain
	MIN_RATIO=1.5 bash testdata/bench-topology.sh $(BIN)/ringtrain 1 4MiB 1

# Churn (testdata/netns-churn.sh): six peers in network namespaces, one
# SIGKILLed or Ctrl-C'd every PERIOD seconds and started again 2 s later
# with the same identity and address, a newcomer joining and a peer
# leaving for good every NEW_EVERY, against the same job undisturbed;
# internal/churnreport prints the figures and fails on any past its bound
# (admission p99 3 s, stall p99 2 s, throughput 0.8×, accuracy within a
# point, one hash, exit statuses, goroutines, files and memory). make
# test churns 90 s on testdata's 2,000 images, beside the other tests:
# their load differs between its undisturbed and churned halves (0.78× at
# one CI, 1.13× at the next), so there its throughput is held only to
# 0.5×, a job that stalls on every event; bench-churn churns DURATION on
# the whole dataset with the machine to itself, held to 0.8×.
test-netns-churn: build
	DATA=testdata/fashion-mnist DURATION=90 PERIOD=10 NEW_EVERY=45 SEC_PER_KIMAGE=0.1 MIN_THROUGHPUT=0.5 bash testdata/netns-churn.sh $(BIN)/ringtrain

# The ring against the network. Two sites (testdata/bench-topology.sh):
# six peers, 1 Gbit/s within a site and one 100 Mbit/s link between, peer
# IDs interleaving the sites; the mlp job and bench allreduce with the
# peers ranked by ID, then by the links they measure, RUNS rounds,
# alternating, and the medians' ratios (make test runs one short round,
# and fails under 1.5×; 3× is what the links allow). Long links
# (testdata/bench-longlinks.sh): four peers at 1 Gbit/s with 50 ms each
# way (cmd/netdelay, as the kernel has no netem), 64 MiB. Then what the
# probe adds to a formation at 4 and 16 peers (BenchmarkProbe).
bench-topology: build fashion-mnist
	JOB_EPOCHS=1 bash testdata/bench-topology.sh $(BIN)/ringtrain $(RUNS) 16MiB 3
	$(GO) build -o $(BIN)/netdelay ./cmd/netdelay
	bash testdata/bench-longlinks.sh $(BIN)/ringtrain $(BIN)/netdelay $(RUNS) 64MiB 3
	$(GO) test ./p2p -run '^$$' -bench Probe -benchtime 5x

DURATION ?= 600
PERIOD ?= 15
bench-churn: build fashion-mnist
	DURATION=$(DURATION) PERIOD=$(PERIOD) bash testdata/netns-churn.sh $(BIN)/ringtrain

# A package's targets share one instrumented test binary (go test -c -fuzz
# instruments it for all of them): linking one per target, as go test
# -fuzz does, took longer than most targets' fuzzing. Each runs in its
# package's folder (its testdata seeds; a failing input is written there)
# with go test's own corpus cache.
# fuzz runs each target's instrumented test binary from FUZZBIN where
# fuzz-build left it there (make test builds them beside its first
# phase, where the cores have room, not in the second), else builds its own.
fuzz:
	@set -e; dir=$$(mktemp -d); trap 'rm -rf $$dir' EXIT; cache=$$($(GO) env GOCACHE)/fuzz; \
	for pkg in $$(echo $(FUZZ) | tr ' ' '\n' | cut -d: -f1 | awk '!seen[$$0]++'); do \
	  targets=$$(echo $(FUZZ) | tr ' ' '\n' | awk -F: -v p=$$pkg '$$1 == p { print $$2 }'); \
	  name=$$(echo $$pkg | tr -d . | tr / _).test; bin=$$dir/$$name; corpus=$$cache/$$($(GO) list $$pkg); \
	  if [ -n "$(FUZZBIN)" ] && [ -x "$(FUZZBIN)/$$name" ]; then bin=$(FUZZBIN)/$$name; \
	  else $(GO) test -c -fuzz "^$$(echo $$targets | cut -d' ' -f1)$$" -o $$bin $$pkg; fi; \
	  for t in $$targets; do \
	    echo "fuzz $$t in $$pkg for $(FUZZTIME)"; \
	    (cd $$pkg && $$bin -test.run '^$$' -test.fuzz "^$$t$$" -test.fuzztime $(FUZZTIME) \
	      -test.fuzzcachedir $$corpus -test.timeout 10m); \
	  done; \
	done
	@# Not a decoder: each input is a whole matrix product on three kernels.
	@echo "fuzz FuzzSgemmEdges in ./train/gemm for 3000x"
	$(GO) test -run '^$$' -fuzz '^FuzzSgemmEdges$$' -fuzztime 3000x ./train/gemm

fuzz-build:
	@set -e; mkdir -p $(FUZZBIN); \
	for pkg in $$(echo $(FUZZ) | tr ' ' '\n' | cut -d: -f1 | awk '!seen[$$0]++'); do \
	  first=$$(echo $(FUZZ) | tr ' ' '\n' | awk -F: -v p=$$pkg '$$1 == p { print $$2; exit }'); \
	  $(GO) test -c -fuzz "^$$first$$" -o $(FUZZBIN)/$$(echo $$pkg | tr -d . | tr / _).test $$pkg; \
	done

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

lint: vet fmt-check

# --- CUDA -----------------------------------------------------------------
# The CUDA engine (train/engine, tag ringtrain_cuda — not "cuda", which
# switches gorgonia itself to its cuDNN engine) needs CUDA's headers and
# libraries to build. Where CUDA is not installed, cuda-fetch takes the
# headers and the link-time stub libraries (about 16 MB) out of Debian's
# non-free nvidia-cuda-dev into CUDA_CACHE, through an apt configuration of
# its own (the system's sources are not touched). With CUDA installed, point
# CUDA_ROOT at it (e.g. make cuda CUDA_ROOT=/ for Debian's packages).
CUDA_CACHE ?= $(HOME)/.cache/ringtrain-cuda
CUDA_ROOT  ?= $(CUDA_CACHE)/root
CUDA_LIBS  ?= $(CUDA_ROOT)/usr/lib/x86_64-linux-gnu
CUDA_APT    = -o Dir::Etc::sourcelist=$(CUDA_CACHE)/apt/sources.list -o Dir::Etc::sourceparts=/dev/null \
              -o Dir::State::Lists=$(CUDA_CACHE)/apt/lists -o Dir::Cache=$(CUDA_CACHE)/apt/cache \
              -o Dir::State::status=/var/lib/dpkg/status -o Debug::NoLocking=1
CUDA_ENV    = CGO_ENABLED=1 CGO_CFLAGS="-I$(CUDA_ROOT)/usr/include -Wno-deprecated-declarations -Wno-implicit-function-declaration" \
              CGO_LDFLAGS="-L$(CUDA_LIBS)/stubs -L$(CUDA_LIBS)"

cuda-apt:
	@mkdir -p $(CUDA_CACHE)/apt/lists/partial $(CUDA_CACHE)/apt/cache/archives/partial
	@echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm main contrib non-free" > $(CUDA_CACHE)/apt/sources.list
	@apt-get $(CUDA_APT) update -qq >/dev/null 2>&1

cuda-fetch:
	@if [ ! -e $(CUDA_ROOT)/usr/include/cuda.h ]; then \
	  echo "cuda-fetch: CUDA headers and stubs from Debian's nvidia-cuda-dev into $(CUDA_CACHE)"; \
	  $(MAKE) --no-print-directory cuda-apt && \
	  cd $(CUDA_CACHE) && rm -f nvidia-cuda-dev_*.deb && apt-get $(CUDA_APT) download nvidia-cuda-dev >/dev/null 2>&1 && \
	  mkdir -p root && dpkg-deb --fsys-tarfile nvidia-cuda-dev_*.deb | \
	    tar -x -C root --wildcards './usr/include/*' './usr/lib/x86_64-linux-gnu/stubs/*' && \
	  rm -f nvidia-cuda-dev_*.deb; \
	fi

# The CUDA build: bin/ringtrain-cuda. It links only libcuda (the driver's,
# unversioned); cuBLAS 13, 12 or 11 is opened at run time, so one binary
# runs on hosts with any of them (driver >= 520).
cuda: cuda-fetch
	$(CUDA_ENV) $(GO) build -tags ringtrain_cuda -o $(BIN)/ringtrain-cuda ./cmd/ringtrain

# The CUDA engine's own tests (kernels against their Go twins, training
# deterministic and equal to the Host engine's, out-of-memory), as a binary
# to run on a GPU host: bin/engine-cuda.test -test.v
cuda-test: cuda-fetch
	$(CUDA_ENV) $(GO) test -c -tags ringtrain_cuda -o $(BIN)/engine-cuda.test ./train/engine

# Everything a GPU host without Go needs for the figures in one folder
# (binaries stripped and xz'd, Fashion-MNIST, fortunes, the bench configs
# and the PyTorch references): copy bin/gpu there and run `bash
# gpu-bench.sh OUTDIR` (the image models) or `bash gpu-gpt.sh OUTDIR` (the
# GPT).
TORCH_BENCH ?= ../shared/bench/torch_fmnist_gpu.py
TORCH_GPT ?= ../shared/bench/torch_gpt.py
gpu-pack: cuda-fetch fashion-mnist fortunes
	@rm -rf $(BIN)/gpu && mkdir -p $(BIN)/gpu/fmnist
	$(CUDA_ENV) $(GO) build -tags ringtrain_cuda -ldflags='-s -w' -o $(BIN)/gpu/ringtrain-cuda ./cmd/ringtrain
	$(CUDA_ENV) $(GO) test -c -tags ringtrain_cuda -ldflags='-s -w' -o $(BIN)/gpu/engine-cuda.test ./train/engine
	$(GO) build -ldflags='-s -w' -o $(BIN)/gpu/gpteval ./internal/gpteval
	xz -6 -T0 $(BIN)/gpu/ringtrain-cuda $(BIN)/gpu/engine-cuda.test $(BIN)/gpu/gpteval
	cp $(FASHION)/*.gz $(BIN)/gpu/fmnist/
	cp testdata/gpu-bench.sh testdata/gpu-gpt.sh testdata/gpu-conv.sh testdata/gpu-quick.sh testdata/bench-cnn-1.json testdata/bench-cnn-2.json testdata/gpt-quality-job.json $(BIN)/gpu/
	mkdir -p $(BIN)/gpu/fortunes && find $(FORTUNES) -maxdepth 1 -type f ! -name '*.*' -exec cp {} $(BIN)/gpu/fortunes/ \;
	@if [ -e $(TORCH_BENCH) ]; then cp $(TORCH_BENCH) $(BIN)/gpu/; else echo "gpu-pack: no $(TORCH_BENCH): the PyTorch side will be skipped"; fi
	@if [ -e $(TORCH_GPT) ]; then cp $(TORCH_GPT) $(BIN)/gpu/; else echo "gpu-pack: no $(TORCH_GPT): the PyTorch side will be skipped"; fi
	@du -sh $(BIN)/gpu

# What CI can check without a GPU: the CUDA code and its tests vet and
# build; the binary links no cuBLAS, and CUDA 11.8's libcublas exports every
# entry point the engine looks up at run time (CUDA 13's was seen to on the
# GPU host); and the binary, started where the driver finds no device (here:
# the stub libcuda), stops at once with one line saying so. Skipped, with a line
# saying why, where nvidia-cuda-dev cannot be had.
cuda-check:
	@$(MAKE) --no-print-directory cuda-fetch || true
	@if [ ! -e $(CUDA_ROOT)/usr/include/cuda.h ]; then \
	  echo "cuda-check: SKIPPED, Debian's nvidia-cuda-dev could not be downloaded (needs deb.debian.org)"; exit 0; \
	fi; \
	echo "cuda-check: go vet and go build -tags ringtrain_cuda"; \
	stubs=$$(mktemp -d); trap 'rm -rf $$stubs' EXIT; \
	quiet() { "$$@" >$$stubs/log 2>&1 || { grep -v -e 'warning:' -e cgo-gcc-prolog -e 'note:' -e '^ *[0-9]* |' -e '^ *|' $$stubs/log; return 1; }; }; \
	quiet env $(CUDA_ENV) $(GO) vet -tags ringtrain_cuda ./... || { echo "cuda-check: go vet failed"; exit 1; }; \
	quiet env $(CUDA_ENV) $(GO) build -tags ringtrain_cuda -o $(BIN)/ringtrain-cuda ./cmd/ringtrain || { echo "cuda-check: build failed"; exit 1; }; \
	if readelf -d $(BIN)/ringtrain-cuda | grep -q 'NEEDED.*libcublas'; then echo "cuda-check: ringtrain-cuda links cuBLAS; it must open it at run time"; exit 1; fi; \
	syms=$$(nm -D --defined-only $(CUDA_LIBS)/stubs/libcublas.so); \
	for s in $$(grep -o 'dlsym(b->lib, "[A-Za-z_0-9]*")' train/engine/cuda.go | cut -d'"' -f2); do \
	  grep -qw $$s <<<"$$syms" || { echo "cuda-check: CUDA 11.8's libcublas lacks $$s, which the engine looks up"; exit 1; }; \
	done; \
	quiet env $(CUDA_ENV) $(GO) test -c -tags ringtrain_cuda -o $$stubs/engine-cuda.test ./train/engine || { echo "cuda-check: the CUDA tests do not build"; exit 1; }; \
	ln -s $(CUDA_LIBS)/stubs/libcuda.so $$stubs/libcuda.so.1; \
	out=$$(LD_LIBRARY_PATH=$$stubs $(BIN)/ringtrain-cuda id 2>&1) && { echo "cuda-check: ringtrain-cuda started without a GPU: $$out"; exit 1; }; \
	if [ "$$(printf '%s\n' "$$out" | wc -l)" = 1 ] && printf '%s' "$$out" | grep -q '^ringtrain: no CUDA device found'; then \
	  echo "cuda-check: ok; without a GPU ringtrain-cuda says: $$out"; \
	else echo "cuda-check: want one line 'ringtrain: no CUDA device found …', got:"; echo "$$out"; exit 1; fi

# nvcc, for remaking the kernels' PTX (`make ptx`); not needed to build.
NVCC_HOME = $(CUDA_CACHE)/toolkit
cuda-toolkit: cuda-fetch
	@if [ ! -x $(NVCC_HOME)/usr/lib/nvidia-cuda-toolkit/bin/nvcc ]; then \
	  $(MAKE) --no-print-directory cuda-apt && mkdir -p $(NVCC_HOME) && cd $(CUDA_CACHE) && \
	  apt-get $(CUDA_APT) download nvidia-cuda-toolkit libnvvm4 >/dev/null 2>&1 && \
	  for d in nvidia-cuda-toolkit_*.deb libnvvm4_*.deb; do dpkg -x $$d $(NVCC_HOME); done && \
	  rm -f nvidia-cuda-toolkit_*.deb libnvvm4_*.deb; \
	fi
	@b=$(NVCC_HOME)/usr/lib/nvidia-cuda-toolkit/bin; rm -f $$b/nvcc.profile; { \
	  echo "NVVMIR_LIBRARY_DIR = $(NVCC_HOME)/usr/lib/nvidia-cuda-toolkit/libdevice"; \
	  echo "PATH += $$b:"; echo 'INCLUDES += -I$(CUDA_ROOT)/usr/include $$(_SPACE_)'; } > $$b/nvcc.profile

ptx: cuda-toolkit
	cd train/engine/ptx && LD_LIBRARY_PATH=$(NVCC_HOME)/usr/lib/x86_64-linux-gnu \
	  NVCC=$(NVCC_HOME)/usr/lib/nvidia-cuda-toolkit/bin/nvcc $(GO) generate .

# Allreduce figures (ring/RESULTS.md): n = 2 and 4 over loopback TCP, each row
# a median of ITERS calls, next to the pattern ceiling measured in the same run.
ITERS ?= 15
BENCHFLAGS ?=
bench: build
	$(BIN)/ringtrain bench allreduce --transport tcp --peers 2 --sizes 1MiB,16MiB,64MiB --iters $(ITERS) $(BENCHFLAGS)
	$(BIN)/ringtrain bench allreduce --transport tcp --peers 4 --sizes 1MiB,16MiB,64MiB --iters $(ITERS) $(BENCHFLAGS)
	$(MAKE) --no-print-directory bench-data
	$(MAKE) --no-print-directory bench-train
	$(MAKE) --no-print-directory bench-train-cnn
	$(MAKE) --no-print-directory bench-cpu
	$(MAKE) --no-print-directory bench-elastic
	$(GO) test -run '^$$' -bench '^BenchmarkStepOverhead$$' -benchtime 3x -count 5 ./train

# Data pipeline, one core: load → ToTensor → Normalize → batches of 64 over
# the real Fashion-MNIST (Debian's dataset-fashion-mnist, installed here).
bench-data: fashion-mnist
	$(GO) test -run '^$$' -bench '^BenchmarkLoader$$' -cpu 1 -count 5 ./data

FASHION := /usr/share/datasets/fashion-mnist
fashion-mnist:
	@[ -e $(FASHION)/train-images-idx3-ubyte.gz ] || { 	  (apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist) >/dev/null 2>&1 || 	  echo "could not install dataset-fashion-mnist; using testdata/ instead"; }

# Training figures on the full Fashion-MNIST: the mlp for 5 epochs, one
# replica with batch 64 and two with 32 each (the same global batch). Each
# peer logs test accuracy after every epoch and samples/s in its summary.
bench-train: build fashion-mnist
	$(BIN)/ringtrain local -n 1 --config testdata/bench-mlp-1.json 2>&1 | grep -E '"epoch done"|"summary"'
	$(BIN)/ringtrain local -n 2 --config testdata/bench-mlp-2.json 2>&1 | grep -E '"epoch done"|"summary"'

# The cnn the same way, with the default build: one replica on both cores,
# then two with one core each (local gives each peer cores / peers).
bench-train-cnn: build fashion-mnist
	$(BIN)/ringtrain local -n 1 --config testdata/bench-cnn-1.json 2>&1 | grep -E '"epoch done"|"summary"'
	$(BIN)/ringtrain local -n 2 --config testdata/bench-cnn-2.json 2>&1 | grep -E '"epoch done"|"summary"'

# Figures: the CPU engine against PyTorch on this CPU (Debian's
# python3-torch, installed here), alternately, RUNS runs each, medians and
# ratios: mlp and cnn at 1 and 2 threads, two mlp peers against DDP (gloo).
# Debian's PyTorch calls whatever libblas.so.3 is installed: without
# OpenBLAS that is the reference BLAS, 20× slower, and the ratios would
# mean nothing — so OpenBLAS first, and the run stops if libblas.so.3 is
# still another.
TORCH_CPU_BENCH ?= ../shared/bench/torch_fmnist_cpu.py
RUNS ?= 3
bench-cpu: build fashion-mnist
	@dpkg -s libopenblas0-pthread >/dev/null 2>&1 || (apt-get install -y -qq libopenblas0-pthread || (apt-get update -qq && apt-get install -y -qq libopenblas0-pthread)) >/dev/null 2>&1 || echo "could not install libopenblas0-pthread"
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || (apt-get install -y -qq python3-torch || (apt-get update -qq && apt-get install -y -qq python3-torch)) >/dev/null 2>&1 || echo "could not install python3-torch"
	@blas=$$(readlink -f "$$(/sbin/ldconfig -p | awk '/libblas\.so\.3 /{print $$NF; exit}')"); \
	  case $$blas in *openblas*) echo "bench-cpu: PyTorch's libblas.so.3 is $$blas" ;; \
	  *) echo "bench-cpu: libblas.so.3 is $$blas, not OpenBLAS: PyTorch would run on the reference BLAS"; exit 1 ;; esac
	bash testdata/bench-cpu.sh $(BIN)/ringtrain $(TORCH_CPU_BENCH) $(RUNS)

# ringtrain's GPT against ../shared/bench/torch_gpt.py: tokens/s at 1 and
# 2 threads and as 2 processes (DDP over gloo), medians of RUNS.
bench-gpt: build fortunes
	@dpkg -s libopenblas0-pthread >/dev/null 2>&1 || (apt-get install -y -qq libopenblas0-pthread || (apt-get update -qq && apt-get install -y -qq libopenblas0-pthread)) >/dev/null 2>&1 || echo "could not install libopenblas0-pthread"
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || (apt-get install -y -qq python3-torch || (apt-get update -qq && apt-get install -y -qq python3-torch)) >/dev/null 2>&1 || echo "could not install python3-torch"
	bash testdata/bench-gpt.sh $(BIN)/ringtrain ../shared/bench/torch_gpt.py $(RUNS)

# Figures: SIGKILL of one of 4 peers to the survivors' first step
# in the new generation (median of 5), and the accuracy cost of losing a
# peer in a 3-epoch mlp run on the full Fashion-MNIST.
# A newcomer's catching up from 1, 2 and 4 donors (a 9.8M-parameter mlp
# with Adam, 1 Gbit/s links in network namespaces) against the time its
# bytes take on one link; RUNS runs each.
bench-donors: build fashion-mnist
	bash testdata/bench-donors.sh $(BIN)/ringtrain $(RUNS) "1 2 4"

bench-elastic: fashion-mnist
	$(GO) test -tags bench -v -count=1 -run '^TestBenchElastic$$' -timeout 60m ./cmd/ringtrain | grep -E '^bench-elastic|FAIL|ok'

# Figures: the netns-nat.sh ring on a flat network and behind the NATs,
# with default settings, alternately, NAT_RUNS runs each (each run prints
# its formation time, its links, direct or relayed, and what carried them);
# then the median formation time and the share of direct links
# (testdata/nat-summary.awk); then allreduce busbw over relayed links
# against direct ones, 16 MiB, 4 peers on loopback.
NAT_RUNS ?= 20
bench-nat: build
	@command -v iptables >/dev/null || (apt-get install -y -qq iptables || (apt-get update -qq && apt-get install -y -qq iptables)) >/dev/null 2>&1 || echo "could not install iptables"
	@for i in $$(seq $(NAT_RUNS)); do \
	  bash testdata/netns-nat.sh --flat $(BIN)/ringtrain | grep -E 'formed in|every link|what carried|FAIL|SKIPPED'; \
	  bash testdata/netns-nat.sh $(BIN)/ringtrain | grep -E 'formed in|hole punches:|every link|what carried|FAIL|SKIPPED'; \
	done | awk -f testdata/nat-summary.awk
	$(BIN)/ringtrain bench allreduce --transport libp2p,libp2p-relay --peers 4 --sizes 16MiB --iters $(ITERS) $(BENCHFLAGS)

# Figures: the data planes side by side, RUNS runs. On loopback in one
# process, n = 2 and 4: plain TCP, the TLS plane, the clear TCP plane and
# libp2p streams — CPU-bound, as two cores carry every rank and both ends
# of every link. Then between network namespaces, each rank its own process
# and libp2p host, every link capped at each of PLANE_RATES
# (testdata/bench-planes.sh): the TLS plane against the clear TCP plane.
# testdata/planes-table.py makes the table of medians (p2p/RESULTS.md).
PLANE_RATES ?= 1gbit 4gbit 10gbit
bench-planes: build
	@for i in $$(seq $(RUNS)); do for n in 2 4; do \
	  $(BIN)/ringtrain bench allreduce --transport tcp,libp2p-tls,libp2p-tcp,libp2p --peers $$n --sizes 1MiB,16MiB,64MiB --iters $(ITERS) --json; \
	done; done
	@for r in $(PLANE_RATES); do bash testdata/bench-planes.sh $(BIN)/ringtrain $$r $(RUNS) 1MiB,16MiB,64MiB 5; done

# Allreduce with every rank its own process, as gloo's and MPI's benchmarks
# run: ringtrain's plain TCP ring and its TLS plane (bench allreduce
# --procs; each TLS rank its own libp2p host, forming the ring as join
# does) and PyTorch's gloo (testdata/gloo-allreduce.py; Debian's
# python3-torch, installed here), 4 ranks on loopback, alternately, RUNS
# runs each, ITERS rounds a row.
bench-procs: build
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || (apt-get install -y -qq python3-torch || (apt-get update -qq && apt-get install -y -qq python3-torch)) >/dev/null 2>&1 || echo "could not install python3-torch"
	@for i in $$(seq $(RUNS)); do \
	  $(BIN)/ringtrain bench allreduce --procs --transport tcp,tls --peers 4 --sizes 1MiB,16MiB --iters $(ITERS) --json; \
	  /usr/bin/python3 testdata/gloo-allreduce.py 4 $(ITERS) 1048576 16777216; \
	done

# Slow-link figures: 4 peers in network namespaces, every link
# capped at 100 Mbit/s with tbf, the mlp for 5 epochs on the full
# Fashion-MNIST: float32, bf16 and int8 gradients and DiLoCo with rounds of
# 50 steps, alternately, RUNS runs (about 5 minutes a run); then DiLoCo
# with a plain average as its outer step, dense, with its
# pseudo-gradients top 5% in 4 bits, and those streamed (4 fragments, each
# exchange beside 11 inner steps), for 10 epochs (about a minute a run);
# then each variant's test accuracy per epoch in one plot
# (bin/slow-curves.png, from the first run of each).
#
# Then the slow peer: the last peer's link at 25 Mbit/s, a quarter of the
# others', runs with and without it alternating (DiLoCo dense, sparse, and
# sparse streamed in 4 fragments each beside 11 inner steps); and the
# figures of all of it (testdata/slow-summary.py: medians, time to the
# float32 run's final accuracy, the others' throughput with the slow peer
# against without).
SLOW_AVG = SLOW_OUTER='{"name": "sgd", "lr": 1, "momentum": 0}'
# The GPT's validation loss against PyTorch's after 1,124 steps of
# torch_gpt.py's settings, on 1 peer and on 4 peers of a quarter of the
# batch, and the three curves in one plot (about 25 minutes, PyTorch's
# run the most of it).
bench-gpt-quality: build fortunes
	@/usr/bin/python3 -c 'import torch' 2>/dev/null || (apt-get install -y -qq python3-torch || (apt-get update -qq && apt-get install -y -qq python3-torch)) >/dev/null 2>&1 || echo "could not install python3-torch"
	$(GO) build -o $(BIN)/gpteval ./internal/gpteval
	bash testdata/bench-gpt-quality.sh $(BIN)/ringtrain $(BIN)/gpteval ../shared/bench/torch_gpt.py $(BIN)/gpt-quality

# DiLoCo on the GPT over 100 Mbit/s links (network namespaces, root):
# 2 peers of batch 16 (torch_gpt.py's batch of 32 in all); synchronous
# training for 2 epochs, then DiLoCo for 6 — dense and sparse 4-bit with
# the outer Nesterov step, and sparse 4-bit with a plain average; the
# validation loss every 200 steps (synchronous) or at every round's end
# (DiLoCo) and at each epoch's end; the bytes each sent to reach the
# synchronous run's final validation loss.
GPT_SLOW := SLOW_MODEL=gpt SLOW_PEERS=2 SLOW_BATCH=16 SLOW_EVAL_EVERY=200 SLOW_LOGS=$(BIN)/slow-logs/gpt
bench-gpt-slow: build fortunes
	$(GPT_SLOW) bash testdata/netns-slow.sh $(BIN)/ringtrain none 1 100mbit 2 | tee $(BIN)/slow-gpt.txt
	$(GPT_SLOW) SLOW_EVAL_EVERY=50 bash testdata/netns-slow.sh $(BIN)/ringtrain none+h50,none+h50+k5+q4 1 100mbit 6 | tee -a $(BIN)/slow-gpt.txt
	$(GPT_SLOW) SLOW_EVAL_EVERY=50 SLOW_OUTER='{"name": "sgd", "lr": 1, "momentum": 0}' \
	  bash testdata/netns-slow.sh $(BIN)/ringtrain none+h50+k5+q4 1 100mbit 6 | tee -a $(BIN)/slow-gpt.txt
	python3 testdata/slow-gpt-summary.py < $(BIN)/slow-gpt.txt

bench-slow: build fashion-mnist
	rm -rf $(BIN)/slow-logs $(BIN)/slow-*.txt
	SLOW_LOGS=$(BIN)/slow-logs/5 bash testdata/netns-slow.sh $(BIN)/ringtrain none,bf16,int8,none+h50 $(RUNS) 100mbit 5 | tee $(BIN)/slow-5.txt
	SLOW_LOGS=$(BIN)/slow-logs/10 $(SLOW_AVG) bash testdata/netns-slow.sh $(BIN)/ringtrain none+h50,none+h50+k5+q4,none+h50+k5+q4+f4+o11,none+h50+k5+q4+d5 $(RUNS) 100mbit 10 | tee $(BIN)/slow-10.txt
	for r in $$(seq $(RUNS)); do for last in "" 25mbit; do \
	  SLOW_LAST_RATE=$$last $(SLOW_AVG) bash testdata/netns-slow.sh $(BIN)/ringtrain none+h50,none+h50+k5+q4,none+h50+k5+q4+f4+o11 1 100mbit 5; \
	done; done | tee $(BIN)/slow-peer.txt
	$(MAKE) --no-print-directory bench-deadline
	python3 testdata/slow-summary.py $(BIN)/slow-5.txt $(BIN)/slow-10.txt $(BIN)/slow-peer.txt $(BIN)/slow-deadline.txt
	$(BIN)/ringtrain plot --by file -o $(BIN)/slow-curves.png "float32=$(BIN)/slow-logs/5/none-1.jsonl" "int8=$(BIN)/slow-logs/5/int8-1.jsonl" \
	  "DiLoCo H=50, Nesterov=$(BIN)/slow-logs/5/none+h50-1.jsonl" "DiLoCo H=50, average=$(BIN)/slow-logs/10/none+h50-1.jsonl" \
	  "DiLoCo H=50, average, top 5% in 4 bits=$(BIN)/slow-logs/10/none+h50+k5+q4-1.jsonl" \
	  "the same, streamed: 4 fragments, overlap 11=$(BIN)/slow-logs/10/none+h50+k5+q4+f4+o11-1.jsonl" \
	  "top 5% in 4 bits, rounds by a 5 ms deadline=$(BIN)/slow-logs/10/none+h50+k5+q4+d5-1.jsonl"

# A peer slow to compute: the last of the four peers held to 15% of one
# CPU (a cgroup's CPU quota; the others share the 2 cores), sparse DiLoCo
# with and without rounds that close by a 5 ms deadline, each run in turn
# with and without the slow peer, RUNS times; then the same two with the
# slow link instead (the last peer's at 25 Mbit/s).
bench-deadline: build fashion-mnist
	for r in $$(seq $(RUNS)); do for cpu in "" 15; do \
	  SLOW_LAST_CPU=$$cpu $(SLOW_AVG) bash testdata/netns-slow.sh $(BIN)/ringtrain none+h50+k5+q4,none+h50+k5+q4+d5 1 100mbit 5; \
	done; done | tee $(BIN)/slow-deadline.txt
	for r in $$(seq $(RUNS)); do for last in "" 25mbit; do \
	  SLOW_LAST_RATE=$$last $(SLOW_AVG) bash testdata/netns-slow.sh $(BIN)/ringtrain none+h50+k5+q4+d5 1 100mbit 5; \
	done; done | tee -a $(BIN)/slow-deadline.txt
	python3 testdata/slow-summary.py $(BIN)/slow-deadline.txt

# Gradient buckets overlapped with backward: the cnn on the own engine in
# pure Go (--device host), the first 6,400 training samples (25 steps a
# peer), the same 4 peers at 100 Mbit/s, buckets off and at 25 MB.
bench-overlap: build fashion-mnist
	SLOW_MODEL=cnn SLOW_DEVICE=host SLOW_TRAIN=6400 bash testdata/netns-slow.sh $(BIN)/ringtrain none+b0,none+b25 $(RUNS) 100mbit 1

# Pipeline stages: the bubble against (S−1)/(M+S−1), each stage's peak
# micro-batches in flight and the speedup of 2 and 4 stages over one peer
# (ringtrain bench pipeline, RUNS runs), then the full Fashion-MNIST as 2
# stages × 2 replicas with float32 and with bf16 boundaries.
bench-pipeline: build fashion-mnist
	bash testdata/bench-pipeline.sh $(BIN)/ringtrain $(RUNS) 3

# A 3-process job on the full dataset while a hostile peer floods the
# first with each kind of traffic for 60 s (p2p/RESULTS.md): the job's
# samples/s against the window before, RSS, goroutines, one hash at the end.
bench-flood: build fashion-mnist
	$(BIN)/ringtrain bench flood --runs $(RUNS)

# testdata/ is made from the real Fashion-MNIST; the output is committed.
# Figures: the served path's samples/s on loopback against a
# loader on local files, then two peers' epochs on served data against
# local files (a data node on the same machine), RUNS times alternating.
bench-served: build fashion-mnist
	$(BIN)/ringtrain bench served --runs $(RUNS)
	bash testdata/bench-served.sh $(BIN)/ringtrain $(RUNS) 2

testdata: fashion-mnist
	$(GO) run ./cmd/mktestdata -src $(FASHION) -out testdata

# Three peers (real processes) train the mlp (MODEL=cnn: the 2-conv net,
# far slower on a CPU) for two epochs on the real Fashion-MNIST and print
# their test accuracy. Without Debian's package (and
# no way to install it) it falls back to the subset in testdata/.
demo: build $(if $(filter gpt,$(MODEL)),fortunes,fashion-mnist)
	@if [ "$(MODEL)" = gpt ]; then $(MAKE) --no-print-directory demo-gpt; exit; fi; \
	if [ -e $(FASHION)/train-images-idx3-ubyte.gz ]; then \
	  cfg=testdata/demo-job.json; echo "demo: full Fashion-MNIST from $(FASHION)"; \
	else \
	  cfg=testdata/job.json; echo "demo: Fashion-MNIST not installed; training on the 2,000-image subset in testdata/"; \
	fi; \
	rm -rf $(BIN)/demo-logs; \
	format=console; [ -t 1 ] && format=auto; \
	$(BIN)/ringtrain local -n 3 --config $$cfg --model $(MODEL) --log-format $$format --log-dir $(BIN)/demo-logs --trace $(BIN)/demo-trace.json && \
	$(BIN)/ringtrain plot $(BIN)/demo-logs/*.jsonl -o $(BIN)/demo-curves.png

# make demo MODEL=gpt: three peers train a byte-level GPT (torch_gpt.py's
# shape) on Debian's fortunes for an epoch, then it writes a sample of
# text. Where apt cannot install fortunes, the corpus is Go's own net/http
# sources, which every machine that builds ringtrain has.
FORTUNES := /usr/share/games/fortunes
fortunes:
	@[ -d $(FORTUNES) ] || { (apt-get install -y -qq fortunes || (apt-get update -qq && apt-get install -y -qq fortunes)) >/dev/null 2>&1 || \
	  echo "could not install fortunes; using Go's net/http sources instead"; }

demo-gpt: build fortunes
	@rm -rf $(BIN)/demo-gpt $(BIN)/demo-gpt-logs; mkdir -p $(BIN)/demo-gpt; \
	if [ -d $(FORTUNES) ]; then cp testdata/gpt-demo-job.json $(BIN)/demo-gpt/job.json; echo "demo: a GPT on Debian's fortunes"; \
	else sed 's|"folder": "$(FORTUNES)"|"glob": "'"$$($(GO) env GOROOT)"'/src/net/http/*.go"|' testdata/gpt-demo-job.json >$(BIN)/demo-gpt/job.json; \
	  echo "demo: fortunes not installed; a GPT on Go's net/http sources"; fi; \
	sed -i 's|"checkpoint_dir": "bin/demo-gpt"|"checkpoint_dir": "$(abspath $(BIN))/demo-gpt"|' $(BIN)/demo-gpt/job.json; \
	format=console; [ -t 1 ] && format=auto; \
	$(BIN)/ringtrain local -n 3 --config $(BIN)/demo-gpt/job.json --log-format $$format --log-dir $(BIN)/demo-gpt-logs && \
	echo "--- a sample of its text:" && \
	$(BIN)/ringtrain generate --checkpoint $(BIN)/demo-gpt/gpt-fortunes-demo.ckpt --prompt "The " --tokens 300 --seed 1

clean:
	rm -rf $(BIN)
