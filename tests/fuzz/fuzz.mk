# fuzz.mk - builds the libFuzzer targets with clang (ASan + UBSan) and runs
# each for FUZZ_TIME seconds from a generated seed corpus. Included from the
# top-level Makefile's `fuzz` target.
FUZZ_TIME ?= 20
FUZZ_BUILD = build-fuzz
FUZZ_SRC = common/status.c common/hash.c common/utf8.c common/strmap.c common/split_name.c engine/model/quant.c engine/model/gguf.c engine/model/unicode.c engine/model/unicode_data.c \
           engine/model/tokenizer.c engine/model/tok_spm.c engine/model/tok_bpe.c
FUZZ_CFLAGS = -std=c11 -D_GNU_SOURCE -g -O1 -Icommon/include -Itext/include -Iengine/include -Iengine/model -Iengine/compute -Iengine/constrain -Iengine/serve -Iengine/backend -Inet -Ikube \
              -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all

# the text library, and the server's chat renderer on it
TEXT_SRC = text/gbnf.c text/jinja_value.c text/jinja_parse.c text/jinja_eval.c text/jinja_lib.c text/chat.c text/schema.c \
           text/regex.c text/tools.c
JINJA_SRC = $(TEXT_SRC) server/srv_chat.c
# the bounded JSON reader and the stack helper (they link jansson)
JSON_SRC = common/json.c common/thread.c
REQ_SRC = $(JSON_SRC) server/srv_api.c tests/fuzz/seam_lora.c server/srv_fields.c engine/constrain/grammar.c engine/constrain/grammar_cost.c common/strbuf.c \
          common/log.c common/clock.c engine/serve/sampler.c $(JINJA_SRC)
REQ_TIME ?= 10
LLMD_TIME ?= 10

.PHONY: run
TENANT_TIME ?= 10
GRAMMAR_TIME ?= 10
SCHEMA_TIME ?= 10
JINJA_TIME ?= 15
TOOLS_TIME ?= 10
JSON_TIME ?= 10
FETCH_TIME ?= 10

run: $(FUZZ_BUILD)/fuzz_gguf $(FUZZ_BUILD)/fuzz_request $(FUZZ_BUILD)/fuzz_llmd $(FUZZ_BUILD)/fuzz_tenant \
     $(FUZZ_BUILD)/fuzz_grammar $(FUZZ_BUILD)/fuzz_schema $(FUZZ_BUILD)/fuzz_jinja $(FUZZ_BUILD)/fuzz_tools $(FUZZ_BUILD)/fuzz_json \
     $(FUZZ_BUILD)/fuzz_fetch
	@rm -rf $(FUZZ_BUILD)/corpus && mkdir -p $(FUZZ_BUILD)/corpus
	@python3 tests/fuzz/make_seeds.py $(FUZZ_BUILD)/seeds
	@$(FUZZ_BUILD)/fuzz_gguf $(FUZZ_BUILD)/seeds/* > $(FUZZ_BUILD)/regress.log 2>&1 || \
	  (cat $(FUZZ_BUILD)/regress.log; echo "fuzz: regression inputs failed"; exit 1)
	@echo "fuzz: $$(grep -c '^Executed' $(FUZZ_BUILD)/regress.log) seed and regression inputs ran clean"
	@echo "fuzz: $(FUZZ_TIME) s of fuzzing the GGUF reader and vocab loader"
	@$(FUZZ_BUILD)/fuzz_gguf -max_total_time=$(FUZZ_TIME) -max_len=8192 -timeout=10 \
	  -rss_limit_mb=2048 $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/seeds 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY|INFO: Running)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || (echo "fuzz: 0 passed, 1 failed (GGUF reader)"; exit 1)
	@echo "fuzz: $(REQ_TIME) s of fuzzing llm-server's request parsing"
	@mkdir -p $(FUZZ_BUILD)/req-corpus && cp tests/fuzz/requests/* $(FUZZ_BUILD)/req-corpus/
	@FUZZ_VOCAB=$(FUZZ_BUILD)/seeds/spm.gguf $(FUZZ_BUILD)/fuzz_request -max_total_time=$(REQ_TIME) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/req-corpus 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || (echo "fuzz: 1 passed, 1 failed (request parsing)"; exit 1)
	@echo "fuzz: $(LLMD_TIME) s of fuzzing llm-controller's desired state from LLMDeployment specs"
	@mkdir -p $(FUZZ_BUILD)/llmd-corpus && cp tests/fuzz/llmd/* $(FUZZ_BUILD)/llmd-corpus/
	@$(FUZZ_BUILD)/fuzz_llmd -max_total_time=$(LLMD_TIME) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/llmd-corpus 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || (echo "fuzz: 2 passed, 1 failed (LLMDeployment specs)"; exit 1)
	@echo "fuzz: $(TENANT_TIME) s of fuzzing llm-server's API keys file and admin body"
	@mkdir -p $(FUZZ_BUILD)/tenant-corpus && cp tests/fuzz/tenant/* $(FUZZ_BUILD)/tenant-corpus/
	@$(FUZZ_BUILD)/fuzz_tenant -max_total_time=$(TENANT_TIME) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/tenant-corpus 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || (echo "fuzz: 3 passed, 1 failed (keys file, admin body)"; exit 1)
	@echo "fuzz: $(GRAMMAR_TIME) s of fuzzing the grammar compiler and matcher"
	@mkdir -p $(FUZZ_BUILD)/grammar-corpus && cp tests/fuzz/grammars/* $(FUZZ_BUILD)/grammar-corpus/
	@$(FUZZ_BUILD)/fuzz_grammar -max_total_time=$(GRAMMAR_TIME) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/grammar-corpus 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || (echo "fuzz: 4 passed, 1 failed (grammars)"; exit 1)
	@echo "fuzz: $(SCHEMA_TIME) s of fuzzing llm-server's JSON Schema to grammar conversion"
	@mkdir -p $(FUZZ_BUILD)/schema-corpus && cp tests/fuzz/schemas/* $(FUZZ_BUILD)/schema-corpus/
	@$(FUZZ_BUILD)/fuzz_schema -max_total_time=$(SCHEMA_TIME) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/schema-corpus 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || (echo "fuzz: 5 passed, 1 failed (JSON schemas)"; exit 1)
	@echo "fuzz: $(JINJA_TIME) s of fuzzing the Jinja interpreter (seeds: tests/fuzz/jinja and ../shared's chat templates)"
	@mkdir -p $(FUZZ_BUILD)/jinja-corpus && cp tests/fuzz/jinja/* $(FUZZ_BUILD)/jinja-corpus/
	@if [ -d ../shared/testdata/chat-templates ]; then cp ../shared/testdata/chat-templates/*.jinja $(FUZZ_BUILD)/jinja-corpus/; fi
	@$(FUZZ_BUILD)/fuzz_jinja -max_total_time=$(JINJA_TIME) -max_len=16384 -timeout=10 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/jinja-corpus 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || (echo "fuzz: 6 passed, 1 failed (Jinja)"; exit 1)
	@echo "fuzz: $(TOOLS_TIME) s of fuzzing tool calls read back from model answers"
	@mkdir -p $(FUZZ_BUILD)/tools-corpus && cp tests/fuzz/tools/* $(FUZZ_BUILD)/tools-corpus/
	@$(FUZZ_BUILD)/fuzz_tools -max_total_time=$(TOOLS_TIME) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/tools-corpus 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || (echo "fuzz: 7 passed, 1 failed (tool calls)"; exit 1)
	@echo "fuzz: $(JSON_TIME) s of fuzzing the bounded JSON reader and the router's field readers against jansson"
	@mkdir -p $(FUZZ_BUILD)/json-corpus && cp tests/fuzz/json/* tests/fuzz/requests/* $(FUZZ_BUILD)/json-corpus/
	@$(FUZZ_BUILD)/fuzz_json -max_total_time=$(JSON_TIME) -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/json-corpus 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY)" ; \
	  test $${PIPESTATUS[0]} -eq 0 || (echo "fuzz: 8 passed, 1 failed (JSON reader)"; exit 1)
	@echo "fuzz: $(FETCH_TIME) s of fuzzing model sources (URIs) and the header lines of their servers' answers"
	@mkdir -p $(FUZZ_BUILD)/fetch-corpus && cp tests/fuzz/fetch/* $(FUZZ_BUILD)/fetch-corpus/
	@$(FUZZ_BUILD)/fuzz_fetch -max_total_time=$(FETCH_TIME) -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	  $(FUZZ_BUILD)/fetch-corpus 2>&1 | grep -E "^(#[0-9]+ *DONE|Done|==|SUMMARY)" ; \
	  test $${PIPESTATUS[0]} -eq 0 && echo "fuzz: 10 passed, 0 failed" || (echo "fuzz: 9 passed, 1 failed (model sources)"; exit 1)

$(FUZZ_BUILD)/fuzz_gguf: tests/fuzz/fuzz_gguf.c $(FUZZ_SRC) $(wildcard engine/*/*.h engine/include/llm/*.h common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) tests/fuzz/fuzz_gguf.c $(FUZZ_SRC) -lm -lpthread -o $@

# (srv_embed.c's parsing: its running half is behind link seams in fuzz_request.c)
$(FUZZ_BUILD)/fuzz_request: tests/fuzz/fuzz_request.c server/srv_embed.c $(REQ_SRC) $(FUZZ_SRC) $(wildcard server/*.h engine/include/llm/*.h text/include/llm/*.h common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) -Iserver tests/fuzz/fuzz_request.c server/srv_embed.c $(REQ_SRC) $(FUZZ_SRC) -ljansson -lcrypto -lm \
	  -lpthread -o $@

# the planner and what it decides with (pure: no API client)
LLMD_SRC = controller/desired.c controller/canary.c controller/plan.c controller/rollout.c controller/autoscale.c \
           controller/pod_diag.c kube/kube_meta.c kube/kube_json.c net/prom_text.c common/status.c common/strbuf.c common/clock.c
$(FUZZ_BUILD)/fuzz_llmd: tests/fuzz/fuzz_llmd.c $(LLMD_SRC) $(wildcard controller/*.h kube/*.h net/*.h common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) -Icontroller -Ikube tests/fuzz/fuzz_llmd.c $(LLMD_SRC) -lm -ljansson -lcrypto -o $@

TENANT_SRC = $(JSON_SRC) common/sync.c net/api_keys.c server/srv_api.c tests/fuzz/seam_lora.c server/srv_fields.c engine/constrain/grammar.c engine/constrain/grammar_cost.c net/http_guard.c \
             common/strbuf.c common/clock.c common/log.c engine/serve/sampler.c net/http_reply.c $(JINJA_SRC)

$(FUZZ_BUILD)/fuzz_tenant: tests/fuzz/fuzz_tenant.c $(TENANT_SRC) $(FUZZ_SRC) $(wildcard server/*.h engine/include/llm/*.h text/include/llm/*.h common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) -Iserver tests/fuzz/fuzz_tenant.c $(TENANT_SRC) $(FUZZ_SRC) -lcivetweb -ljansson -lcrypto -lm -lpthread -o $@

GRAMMAR_SRC = engine/constrain/grammar.c engine/constrain/grammar_cost.c engine/constrain/gmatch.c engine/model/tokenizer.c engine/model/tok_spm.c engine/model/tok_bpe.c engine/model/unicode.c \
              engine/model/unicode_data.c engine/model/gguf.c engine/model/quant.c common/status.c common/hash.c common/utf8.c \
              common/strmap.c common/split_name.c
$(FUZZ_BUILD)/fuzz_grammar: tests/fuzz/fuzz_grammar.c $(GRAMMAR_SRC) $(wildcard engine/*/*.h engine/include/llm/*.h common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) tests/fuzz/fuzz_grammar.c $(GRAMMAR_SRC) -lm -lpthread -o $@

SCHEMA_SRC = $(JSON_SRC) server/srv_api.c tests/fuzz/seam_lora.c server/srv_fields.c engine/constrain/grammar.c engine/constrain/grammar_cost.c engine/serve/sampler.c \
             common/strbuf.c common/log.c common/clock.c $(JINJA_SRC)
$(FUZZ_BUILD)/fuzz_schema: tests/fuzz/fuzz_schema.c $(SCHEMA_SRC) $(FUZZ_SRC) $(wildcard server/*.h engine/include/llm/*.h text/include/llm/*.h common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) -Iserver tests/fuzz/fuzz_schema.c $(SCHEMA_SRC) $(filter-out engine/constrain/grammar.c engine/constrain/grammar_cost.c,$(FUZZ_SRC)) -ljansson -lm -lpthread -o $@

$(FUZZ_BUILD)/fuzz_tools: tests/fuzz/fuzz_tools.c $(REQ_SRC) $(FUZZ_SRC) $(wildcard server/*.h engine/include/llm/*.h text/include/llm/*.h common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) -Iserver tests/fuzz/fuzz_tools.c $(REQ_SRC) $(FUZZ_SRC) -ljansson -lm -lpthread -o $@

$(FUZZ_BUILD)/fuzz_json: tests/fuzz/fuzz_json.c tests/fuzz/deep.h common/json.c common/thread.c common/status.c $(wildcard common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) tests/fuzz/fuzz_json.c common/json.c common/thread.c common/status.c -ljansson -lpthread -o $@

FETCH_SRC = net/fetch.c net/fetch_http.c net/fetch_xfer.c net/fetch_hf.c net/fetch_url.c net/http_client.c common/status.c common/json.c common/thread.c \
            common/clock.c common/split_name.c
$(FUZZ_BUILD)/fuzz_fetch: tests/fuzz/fuzz_fetch.c $(FETCH_SRC) $(wildcard net/*.h common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) tests/fuzz/fuzz_fetch.c $(FETCH_SRC) -lcurl -ljansson -lcrypto -lpthread -o $@

$(FUZZ_BUILD)/fuzz_jinja: tests/fuzz/fuzz_jinja.c $(REQ_SRC) $(FUZZ_SRC) $(wildcard server/*.h engine/*/*.h engine/include/llm/*.h text/include/llm/*.h common/include/llm/*.h)
	@mkdir -p $(FUZZ_BUILD)
	@echo "  CLANG $@"
	@clang $(FUZZ_CFLAGS) -Iserver tests/fuzz/fuzz_jinja.c $(REQ_SRC) $(FUZZ_SRC) -ljansson -lm -lpthread -o $@
