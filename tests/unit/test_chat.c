/* test_chat.c - chat template families: detection from template texts and
 * the exact prompt each renders for a system/user/assistant/user dialogue. */
#include "testutil.h"

#include "llm/chat.h"

static const llm_chat_msg dialog[] = {{"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}};

static void check(llm_chat_template t, const char *want)
{
    llm_error err = {0};
    char *got = llm_chat_render(t, dialog, 4, &err);
    assert_non_null(got);
    if (strcmp(got, want))
        fail_msg("%s: rendered\n%s\nwanted\n%s", llm_chat_name(t), got, want);
    free(got);
}

static void test_render(void **st)
{
    (void)st;
    check(LLM_CHAT_CHATML, "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n<|im_start|>assistant\nA1"
                           "<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n");
    check(LLM_CHAT_LLAMA3, "<|start_header_id|>system<|end_header_id|>\n\nS<|eot_id|><|start_header_id|>user"
                           "<|end_header_id|>\n\nU1<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nA1<|eot_id|>"
                           "<|start_header_id|>user<|end_header_id|>\n\nU2<|eot_id|><|start_header_id|>assistant"
                           "<|end_header_id|>\n\n");
    check(LLM_CHAT_LLAMA2, "[INST] <<SYS>>\nS\n<</SYS>>\n\nU1 [/INST] A1 </s><s>[INST] U2 [/INST]");
    check(LLM_CHAT_MISTRAL, "[INST] S\n\nU1 [/INST]A1</s>[INST] U2 [/INST]");
    check(LLM_CHAT_ZEPHYR, "<|system|>\nS</s>\n<|user|>\nU1</s>\n<|assistant|>\nA1</s>\n<|user|>\nU2</s>\n<|assistant|>\n");
    check(LLM_CHAT_GEMMA, "<start_of_turn>user\nS\n\nU1<end_of_turn>\n<start_of_turn>model\nA1<end_of_turn>\n"
                          "<start_of_turn>user\nU2<end_of_turn>\n<start_of_turn>model\n");
}

static void test_detect(void **st)
{
    (void)st;
    static const struct { const char *tmpl; llm_chat_template want; } cases[] = {
        {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'}}", LLM_CHAT_CHATML},
        {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}", LLM_CHAT_LLAMA3},
        {"{{ bos_token + '[INST] ' + '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' }}", LLM_CHAT_LLAMA2},
        {"{{ bos_token }}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}", LLM_CHAT_MISTRAL},
        {"{% if message['role'] == 'user' %}{{ '<|user|>\\n' + message['content'] + eos_token }}", LLM_CHAT_ZEPHYR},
        {"{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}", LLM_CHAT_GEMMA},
        {"something else entirely", LLM_CHAT_CHATML},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_int_equal(llm_chat_detect(cases[i].tmpl, strlen(cases[i].tmpl)), cases[i].want);
    assert_int_equal(llm_chat_detect(NULL, 0), LLM_CHAT_CHATML);
}

static void test_errors(void **st)
{
    (void)st;
    llm_error err = {0};
    llm_chat_msg bad[] = {{"user", "x"}, {"tool", "y"}};
    assert_null(llm_chat_render(LLM_CHAT_CHATML, bad, 2, &err));
    assert_non_null(strstr(err.msg, "messages[1]"));
    assert_null(llm_chat_render(LLM_CHAT_CHATML, bad, 0, &err));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_render), cmocka_unit_test(test_detect),
                                       cmocka_unit_test(test_errors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
