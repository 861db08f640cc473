/* judge_texts.c - the quality gate's texts; see judge_texts.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "judge_texts.h"
#include "llm/json.h"

static const struct {
    const char *name, *text;
} plain[] = {
    {"prose-lighthouse",
     "The lighthouse on the northern cape had been automated for twenty years, but Marta still climbed its stairs "
     "every evening. She told herself it was to check the lamp, though the lamp had never once failed. The truth was "
     "simpler: from the gallery she could see the whole bay, the fishing boats coming home in a loose line, the gulls "
     "settling on the harbour wall, and the last ferry turning its bow toward the mainland. When the wind came from "
     "the east it carried the smell of the bakery on Quay Street, and she would stand there until the light began to "
     "sweep the water, counting the seconds between flashes as her father had taught her. Four seconds dark, one "
     "second bright. Ships had trusted that rhythm for a century."},
    {"prose-bread",
     "Bread rises because yeast, a single-celled fungus, feeds on the sugars released when flour is mixed with water. "
     "As it feeds it produces carbon dioxide and a little alcohol. Kneading develops gluten, a network of proteins "
     "that stretches like a balloon and traps the gas in small pockets. A longer, cooler rise gives the yeast and the "
     "bacteria that live alongside it more time to produce flavour, which is why many bakers leave their dough in the "
     "refrigerator overnight. In the oven the trapped gas expands, the alcohol evaporates, and the starches set, "
     "fixing the open crumb in place while the surface browns and hardens into a crust."},
    {"prose-letter",
     "Dear Mr. Okafor,\n\nThank you for your letter of 14 March and for the samples you enclosed. Our committee met "
     "on Thursday and agreed that the proposal fits the aims of the fund, although two members asked for a clearer "
     "budget for the second year. Could you send a revised table that separates equipment from staff costs, and say "
     "how the project would continue if the grant were not renewed? We would need these by the end of the month to "
     "include your application in the spring round.\n\nWith best wishes,\nHelen Marsh\nSecretary to the Committee"},
    {"code-python",
     "def binary_search(items, target):\n"
     "    \"\"\"Return the index of target in the sorted list items, or -1 if it is absent.\"\"\"\n"
     "    lo, hi = 0, len(items) - 1\n"
     "    while lo <= hi:\n"
     "        mid = (lo + hi) // 2\n"
     "        if items[mid] == target:\n"
     "            return mid\n"
     "        if items[mid] < target:\n"
     "            lo = mid + 1\n"
     "        else:\n"
     "            hi = mid - 1\n"
     "    return -1\n\n\n"
     "def test_binary_search():\n"
     "    data = [1, 3, 5, 7, 9, 11]\n"
     "    assert binary_search(data, 7) == 3\n"
     "    assert binary_search(data, 1) == 0\n"
     "    assert binary_search(data, 4) == -1\n"
     "    assert binary_search([], 4) == -1\n"},
    {"code-c",
     "#include <stdio.h>\n#include <string.h>\n\n"
     "/* Reverses s in place and returns it. */\n"
     "static char *reverse(char *s)\n{\n"
     "    size_t n = strlen(s);\n"
     "    for (size_t i = 0; i < n / 2; i++) {\n"
     "        char t = s[i];\n"
     "        s[i] = s[n - 1 - i];\n"
     "        s[n - 1 - i] = t;\n"
     "    }\n"
     "    return s;\n}\n\n"
     "int main(int argc, char **argv)\n{\n"
     "    for (int i = 1; i < argc; i++)\n"
     "        printf(\"%s\\n\", reverse(argv[i]));\n"
     "    return 0;\n}\n"},
    {"code-shell-json",
     "#!/bin/sh\nset -eu\n# Back up the database, keep seven days of dumps.\n"
     "stamp=$(date +%Y-%m-%d)\n"
     "pg_dump --format=custom --file=\"/backups/app-$stamp.dump\" app\n"
     "find /backups -name 'app-*.dump' -mtime +7 -delete\n"
     "echo \"backup $stamp done\"\n\n"
     "{\n  \"name\": \"inventory-service\",\n  \"version\": \"2.4.1\",\n  \"port\": 8080,\n"
     "  \"database\": {\"host\": \"db.internal\", \"pool\": 16, \"timeout_ms\": 2500},\n"
     "  \"features\": [\"search\", \"bulk-import\", \"audit-log\"]\n}\n"},
};

static const struct {
    const char *name, *system, *user, *assistant;
} chats[] = {
    {"chat-pirate", "You are a pirate. Whatever you are asked, answer in the voice of an old sea pirate.",
     "What is the capital of France?",
     "Arr, matey! The capital of France be Paris, a fine port of call on the River Seine, where the wine flows "
     "freely and the bread be long as a cutlass. Many a sailor has spent his gold there, aye!"},
    {"chat-french", "Réponds toujours en français, quelle que soit la langue de la question.",
     "How are you today, and what should I cook for dinner?",
     "Je vais très bien, merci ! Pour ce soir, je vous propose une omelette aux champignons avec une salade verte : "
     "c'est rapide, simple et délicieux."},
    {"chat-list", "Answer every question as a short bulleted list, one item per line, nothing else.",
     "Which three things should I pack for a day of hiking?",
     "- Two litres of water\n- A waterproof jacket\n- A map of the trail"},
    {"chat-json", "You are an API. Reply only with a JSON object with the keys \"city\" and \"country\".",
     "Where is the Eiffel Tower?", "{\"city\": \"Paris\", \"country\": \"France\"}"},
};

static json_t *chat(const char *name, const char *sys, const char *user, const char *assistant)
{
    return json_pack("{s:s,s:[{s:s,s:s},{s:s,s:s},{s:s,s:s}]}", "name", name, "messages", "role", "system", "content", sys,
                     "role", "user", "content", user, "role", "assistant", "content", assistant);
}

json_t *judge_texts_builtin(void)
{
    json_t *out = json_array();
    for (size_t i = 0; out && i < sizeof plain / sizeof *plain; i++)
        if (json_array_append_new(out, json_pack("{s:s,s:s}", "name", plain[i].name, "prompt", plain[i].text)))
            out = (json_decref(out), NULL);
    for (size_t i = 0; out && i < sizeof chats / sizeof *chats; i++)
        if (json_array_append_new(out, chat(chats[i].name, chats[i].system, chats[i].user, chats[i].assistant)))
            out = (json_decref(out), NULL);
    return out;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One data entry as a text (a new object), or NULL with why. */
static json_t *entry(const char *key, json_t *v, char *why, size_t wn)
{
    size_t kn = strlen(key);
    if (!json_is_string(v) || !json_string_length(v)) {
        snprintf(why, wn, "key %.100s: empty", key);
        return NULL;
    }
    if (kn < 5 || strcmp(key + kn - 5, ".json"))
        return json_pack("{s:s,s:O}", "name", key, "prompt", v);
    llm_error je = {0};
    json_t *o = llm_json_loads(json_string_value(v), 0, &je), *m = json_object_get(o, "messages");
    json_t *out = json_is_array(m) && json_array_size(m) > 0 ? json_pack("{s:s,s:O}", "name", key, "messages", m) : NULL;
    if (!out)
        snprintf(why, wn, "key %.100s: want {\"messages\": [...]} (%s)", key, o ? "no messages" : je.msg);
    json_decref(o);
    return out;
}

json_t *judge_texts_from_configmap(json_t *cm, char *why, size_t wn)
{
    json_t *data = json_object_get(cm, "data"), *v;
    size_t n = json_object_size(data), k = 0;
    const char *key, **keys = NULL;
    why[0] = 0;
    if (!n || n > JUDGE_TEXTS_MAX) {
        snprintf(why, wn, "want 1 to %d texts in data, not %zu", JUDGE_TEXTS_MAX, n);
        return NULL;
    }
    if (!(keys = calloc(n, sizeof *keys))) {
        snprintf(why, wn, "no memory");
        return NULL;
    }
    json_object_foreach(data, key, v) keys[k++] = key;
    qsort(keys, n, sizeof *keys, by_name);
    json_t *out = json_array();
    for (size_t i = 0; out && i < n; i++) {
        json_t *t = entry(keys[i], json_object_get(data, keys[i]), why, wn);
        if (!t || json_array_append_new(out, t))
            out = (json_decref(out), NULL);
    }
    if (!out && !why[0])
        snprintf(why, wn, "no memory");
    free(keys);
    return out;
}
